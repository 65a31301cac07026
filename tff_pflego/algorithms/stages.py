"""Stages given by their TensorFlow parts, so that a round can run them fused.

Each stage here is an ordinary `tff.learning` stage process (its `initialize` and
`next` are federated computations, built from the parts below, and it composes like
any other), and also exposes the TensorFlow computations it is made of:

  SplitDistributor  server(state, model) -> (state', payload, measurements);
                    `next` broadcasts the payload. A pure function of its arguments:
                    a fused round calls it once for the payload and once for the state.
  SplitAggregator   client(value, weight) -> summand at each client,
                    server(state, sum of summands) -> (state', result, measurements);
                    `next` is one `federated_sum` between them.
  SplitFinalizer    server(state, model, update) -> (state', model', measurements).

`composition.compose_process` runs a round of split stages as one server computation
before the broadcast, one client computation, one `federated_sum` and one server
computation after it, instead of each stage's own intrinsics (PFLEGO: 42 intrinsics,
each a pass over the clients or a call on the server, down to 12; same numbers bit
for bit, `tests/test_baselines.py`).
"""

from __future__ import annotations

import collections
from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff

_TFF = tff.learning.templates


NO_STATE = None  # the `initialize` of a stateless stage


def _measured(state, result, measurements) -> tff.templates.MeasuredProcessOutput:
  return tff.templates.MeasuredProcessOutput(state=state, result=result,
                                             measurements=measurements)


def _at_server(initialize: Optional[tff.Computation]) -> tff.Computation:
  """A stage's federated `initialize`: `initialize`'s state, placed at the server; no
  state (`NO_STATE`) is the empty structure, with no TensorFlow graph (an empty graph
  makes Grappler log an error line)."""

  @tff.federated_computation
  def init_fn():
    if initialize is NO_STATE:
      return tff.federated_value((), tff.SERVER)
    return tff.federated_eval(initialize, tff.SERVER)

  return init_fn


class SplitDistributor(_TFF.DistributionProcess):
  """A distributor from `initialize` () -> state and `server` (see module docstring)."""

  def __init__(self, initialize: tff.Computation, server: tff.Computation):
    state_type, model_type = server.type_signature.parameter

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                               tff.FederatedType(model_type, tff.SERVER))
    def next_fn(state, model):
      new_state, payload, measurements = tff.federated_map(server, (state, model))
      return _measured(new_state, tff.federated_broadcast(payload), measurements)

    super().__init__(_at_server(initialize), next_fn)
    self.server = server


class SplitAggregator(tff.templates.AggregationProcess):
  """An aggregator from `initialize`, `client` and `server` (see module docstring)."""

  def __init__(self, initialize: tff.Computation, client: tff.Computation,
               server: tff.Computation):
    value_type, weight_type = client.type_signature.parameter
    state_type = (tff.StructType([]) if initialize is NO_STATE
                  else initialize.type_signature.result)

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                               tff.FederatedType(value_type, tff.CLIENTS),
                               tff.FederatedType(weight_type, tff.CLIENTS))
    def next_fn(state, value, weight):
      sums = tff.federated_sum(tff.federated_map(client, (value, weight)))
      return _measured(*tff.federated_map(server, (state, sums)))

    super().__init__(_at_server(initialize), next_fn)
    self.client = client
    self.server = server


class SplitFinalizer(_TFF.FinalizerProcess):
  """A finalizer from `initialize` () -> state and `server` (see module docstring)."""

  def __init__(self, initialize: tff.Computation, server: tff.Computation):
    state_type, model_type, update_type = server.type_signature.parameter

    @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                               tff.FederatedType(model_type, tff.SERVER),
                               tff.FederatedType(update_type, tff.SERVER))
    def next_fn(state, model, update):
      return _measured(*tff.federated_map(server, (state, model, update)))

    super().__init__(_at_server(initialize), next_fn)
    self.server = server


def is_split(distributor, aggregator, finalizer) -> bool:
  """Whether all three stages expose their TensorFlow parts."""
  return (isinstance(distributor, SplitDistributor)
          and isinstance(aggregator, SplitAggregator)
          and isinstance(finalizer, SplitFinalizer))


def broadcast_distributor(model_type: tff.types.Type) -> SplitDistributor:
  """`tff.learning.templates.build_broadcast_process`: the model, to every client."""

  @tff.tensorflow.computation((), model_type)
  def server(state, model):
    return state, model, ()

  return SplitDistributor(NO_STATE, server)


def optimizer_finalizer(optimizer: tff.learning.optimizers.Optimizer,
                        weights_type: tff.types.Type) -> SplitFinalizer:
  """`tff.learning.templates.build_apply_optimizer_finalizer` with its default
  rejection: model' = optimizer step of the trainable weights by the update; an update
  holding a NaN or Inf leaves the model and the optimizer's state as they were
  (`update_non_finite` = 1)."""
  trainable_type = weights_type.trainable

  @tff.tensorflow.computation
  def initialize():
    return optimizer.initialize(tff.types.type_to_tf_tensor_specs(trainable_type))

  @tff.tensorflow.computation(initialize.type_signature.result, weights_type,
                              trainable_type)
  @tf.function
  def server(state, weights, update):
    new_state, new_trainable = optimizer.next(state, weights.trainable, update)
    non_finite = tf.logical_not(tf.reduce_all(
        [tf.reduce_all(tf.math.is_finite(u)) for u in tf.nest.flatten(update)]))
    measurements = collections.OrderedDict(
        update_non_finite=tf.cast(non_finite, tf.int32))
    if non_finite:
      new_state, new_trainable = state, weights.trainable
    return new_state, tff.learning.models.ModelWeights(
        new_trainable, weights.non_trainable), measurements

  return SplitFinalizer(initialize, server)
