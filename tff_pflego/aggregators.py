"""Server-side aggregation of the clients' updates, as `tff.aggregators` factories.

`ScreenedMeanFactory` aggregates client values v_i with weights N_i in one pass:

  screening   a value holding a NaN or Inf (or a non-finite weight) is replaced by
              zeros with weight 0, so the round proceeds as if that client had not
              reported; the number rejected is the `rejected_updates` measurement;
  mean        m = sum_S N_i v_i / sum_S N_i over the screened clients S (0 when nobody
              reports), as `tff.aggregators.MeanFactory(no_nan_division=True)` computes
              it;
  unbiased    with a participation probability q and the population's N = sum_i N_i,
              the exact-SGD estimate of PFLEGO's body gradient

                g_hat = (1 / q) sum_{i in S} alpha_i g_i = (sum_S N_i / (q N)) m,

              unbiased for sum_i alpha_i g_i = grad_theta L since
              E[1{i in S}] = q.

All of it is one client computation (screen, then N_i v_i), one `federated_sum` of
(N_i v_i, N_i, rejected) and one server computation: composing MeanFactory, a
SumFactory and a rejection wrapper took nine federated intrinsics a round, each one a
pass over the clients in the TFF runtime (~7 ms at 20 clients; profile in
docs/round_profile.md). The numbers are the same bit for bit (same operations in the
same order; docs/same_numbers.md).
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms import stages


class ScreenedMeanFactory(tff.aggregators.WeightedAggregationFactory):
  """The screened weighted mean, optionally made PFLEGO's unbiased estimate (see the
  module docstring): `unbiased=(q, N)` or None."""

  def __init__(self, unbiased: Optional[tuple[float, int]] = None):
    if unbiased is not None:
      participation_prob, total_examples = unbiased
      if not 0 < participation_prob <= 1:
        raise ValueError(
            f"participation_prob must be in (0, 1], got {participation_prob}")
      if total_examples < 1:
        raise ValueError(f"total_examples must be >= 1, got {total_examples}")
    self._unbiased = unbiased

  def create(self, value_type, weight_type) -> stages.SplitAggregator:
    q_times_total = None if self._unbiased is None else (
        self._unbiased[0] * self._unbiased[1])

    @tff.tensorflow.computation(value_type, weight_type)
    def screen_and_weigh(value, weight):
      finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v))
                              for v in tf.nest.flatten(value)])
      finite = tf.logical_and(finite, tf.math.is_finite(tf.cast(weight, tf.float32)))
      weight = tf.where(finite, weight, tf.zeros_like(weight))
      weighted = tf.nest.map_structure(
          lambda v: tf.where(finite, v, tf.zeros_like(v)) * tf.cast(weight, v.dtype),
          value)
      return collections.OrderedDict(weighted_value=weighted, weight=weight,
                                     rejected=tf.cast(tf.logical_not(finite), tf.int32))

    sums_type = screen_and_weigh.type_signature.result

    @tff.tensorflow.computation((), sums_type)
    def estimate(state, sums):
      weight_sum = sums["weight"]
      mean = tf.nest.map_structure(
          lambda x: tf.math.divide_no_nan(x, tf.cast(weight_sum, x.dtype)),
          sums["weighted_value"])
      if q_times_total is not None:
        factor = tf.cast(weight_sum, tf.float32) / q_times_total
        mean = tf.nest.map_structure(lambda m: factor * m, mean)
      return state, mean, collections.OrderedDict(rejected_updates=sums["rejected"],
                                                  reported_examples=weight_sum)

    return stages.SplitAggregator(stages.NO_STATE, screen_and_weigh, estimate)


def build_unbiased_aggregator(update_type, participation_prob: float,
                              total_examples: int) -> stages.SplitAggregator:
  """The estimator of PFLEGO's server step, with non-finite client updates rejected."""
  return ScreenedMeanFactory((participation_prob, total_examples)).create(
      update_type, tff.TensorType(np.float32))


def build_mean_aggregator(update_type) -> stages.SplitAggregator:
  """The weighted mean of the averaging baselines, non-finite updates rejected."""
  return ScreenedMeanFactory().create(update_type, tff.TensorType(np.float32))
