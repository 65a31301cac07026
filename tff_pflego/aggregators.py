"""Server-side aggregation of the clients' body gradients, as `tff.aggregators` factories.

* `UnbiasedEstimateFactory`: the exact-SGD estimator of grad_theta L(psi),

      g_hat = (1 / q) sum_{i in I_t} alpha_i g_i = (1 / (q N)) sum_{i in I_t} N_i g_i,

  where q = P(client i's update reaches the server) and N = sum over ALL clients. Since
  E[1{i in I_t}] = q, E[g_hat] = sum_i alpha_i g_i = grad_theta L. It is built as the
  weighted mean m = sum N_i g_i / sum N_i (an inner `tff.aggregators.MeanFactory`, 0 when
  nobody reports) times sum_{I_t} N_i / (q N).
* `NonFiniteRejectionFactory`: a client value holding a NaN or Inf is replaced by zeros
  with weight 0 before the inner aggregation, so the round proceeds as if that client
  had not reported; the number rejected is the `rejected_updates` measurement.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


class UnbiasedEstimateFactory(tff.aggregators.WeightedAggregationFactory):
  """(1 / (q N)) sum_{i in I_t} N_i g_i with weights N_i (see the module docstring)."""

  def __init__(self, participation_prob: float, total_examples: int,
               mean_factory: tff.aggregators.WeightedAggregationFactory | None = None):
    if not 0 < participation_prob <= 1:
      raise ValueError(f"participation_prob must be in (0, 1], got {participation_prob}")
    if total_examples < 1:
      raise ValueError(f"total_examples must be >= 1, got {total_examples}")
    self._q = participation_prob
    self._total = total_examples
    self._mean_factory = mean_factory or tff.aggregators.MeanFactory(no_nan_division=True)

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    mean_process = self._mean_factory.create(value_type, weight_type)
    weight_sum_process = tff.aggregators.SumFactory().create(weight_type)
    q_times_total = self._q * self._total

    @tff.federated_computation
    def init_fn():
      return tff.federated_zip(collections.OrderedDict(
          mean=mean_process.initialize(), weight_sum=weight_sum_process.initialize()))

    @tff.tensorflow.computation(value_type, weight_type)
    def scale(weighted_mean, weight_sum):
      factor = tf.cast(weight_sum, tf.float32) / q_times_total
      return tf.nest.map_structure(lambda m: factor * m, weighted_mean)

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      mean = mean_process.next(state["mean"], value, weight)
      weight_sum = weight_sum_process.next(state["weight_sum"], weight)
      estimate = tff.federated_map(scale, (mean.result, weight_sum.result))
      new_state = tff.federated_zip(collections.OrderedDict(
          mean=mean.state, weight_sum=weight_sum.state))
      measurements = tff.federated_zip(collections.OrderedDict(
          reported_examples=weight_sum.result))
      return tff.templates.MeasuredProcessOutput(new_state, estimate, measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)


class NonFiniteRejectionFactory(tff.aggregators.WeightedAggregationFactory):
  """Drops client values holding NaN/Inf (value 0, weight 0) before `inner`; counts them."""

  def __init__(self, inner: tff.aggregators.WeightedAggregationFactory):
    self._inner = inner

  def create(self, value_type, weight_type) -> tff.templates.AggregationProcess:
    inner_process = self._inner.create(value_type, weight_type)

    @tff.tensorflow.computation(value_type, weight_type)
    def screen(value, weight):
      finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                              for v in tf.nest.flatten(value)])
      finite = tf.logical_and(finite, tf.math.is_finite(tf.cast(weight, tf.float32)))
      value = tf.nest.map_structure(
          lambda v: tf.where(finite, v, tf.zeros_like(v)), value)
      weight = tf.where(finite, weight, tf.zeros_like(weight))
      return value, weight, tf.cast(tf.logical_not(finite), tf.int32)

    @tff.federated_computation(
        inner_process.initialize.type_signature.result,
        tff.FederatedType(value_type, tff.CLIENTS),
        tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      screened_value, screened_weight, rejected = tff.federated_map(
          screen, (value, weight))
      inner = inner_process.next(state, screened_value, screened_weight)
      measurements = tff.federated_zip(collections.OrderedDict(
          rejected_updates=tff.federated_sum(rejected), inner=inner.measurements))
      return tff.templates.MeasuredProcessOutput(inner.state, inner.result, measurements)

    return tff.templates.AggregationProcess(inner_process.initialize, next_fn)


def build_unbiased_aggregator(update_type, participation_prob: float,
                              total_examples: int) -> tff.templates.AggregationProcess:
  """The estimator of PFLEGO's server step, with non-finite client updates rejected."""
  return NonFiniteRejectionFactory(
      UnbiasedEstimateFactory(participation_prob, total_examples)).create(
          update_type, tff.TensorType(np.float32))
