"""One round of any algorithm here, composed like `tff.learning`'s processes.

  next(state, client_data, client_states):
    distributor   broadcast the server's model to the sampled clients
    client work   each client: (model, dataset, client state) -> update, weight, new
                  client state, metrics
    aggregator    the clients' updates -> the server's step direction
    finalizer     model <- optimizer(model, step direction)
  -> (new state, new client states @CLIENTS, metrics {train @SERVER, clients @CLIENTS})

The algorithms differ only in their parts (`pflego.py`, `averaging.py`). As in
`tff.learning.templates.compose_learning_process`, the parts' types are checked to fit
before anything is composed (`check_stages_fit`).

Stages that expose their TensorFlow parts (`stages.py`) run fused: one server
computation before the broadcast, one client computation (the client work, the
aggregator's client part and the train metrics' summand), one `federated_sum`, one
server computation after it (the aggregator's and finalizer's server parts, the
distributor's new state, the train metrics). The same numbers as composing the stages'
own `next`s, with 12 federated intrinsics a round instead of 42.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms import stages
from tff_pflego.algorithms.api import ServerState


class StagesDoNotFit(TypeError):
  """Two composed stages disagree on the type of what one hands the other."""


def _require(consumer: str, expected: tff.types.Type, producer: str,
             produced: tff.types.Type) -> None:
  if not expected.is_assignable_from(produced):
    raise StagesDoNotFit(f"{producer} produces {produced}, but {consumer} takes {expected}")


def check_stages_fit(initial_model: tff.Computation, distributor, client_work,
                     aggregator, finalizer) -> None:
  """Raises `StagesDoNotFit` unless each stage takes what the previous one gives:

    initial model -> distributor's value and finalizer's model,
    distributor's result -> client work's model,
    client work's `update` / `update_weight` -> aggregator's value / weight,
    aggregator's result -> finalizer's update.
  """
  model_type = initial_model.type_signature.result
  distributor_in = distributor.next.type_signature.parameter[1].member
  _require("the distributor", distributor_in, "the initial model", model_type)
  work_model, _, _ = client_work.type_signature.parameter
  _require("the client work", work_model, "the distributor",
           distributor.next.type_signature.result.result.member)
  work_out = client_work.type_signature.result
  aggregator_value, aggregator_weight = (
      t.member for t in aggregator.next.type_signature.parameter[1:])
  _require("the aggregator", aggregator_value, "the client work's update", work_out.update)
  _require("the aggregator's weight", aggregator_weight, "the client work's update_weight",
           work_out.update_weight)
  finalizer_model, finalizer_update = (
      t.member for t in finalizer.next.type_signature.parameter[1:])
  _require("the finalizer", finalizer_model, "the initial model", model_type)
  _require("the finalizer's update", finalizer_update, "the aggregator",
           aggregator.next.type_signature.result.result.member)


def with_client_data(client_work: tff.Computation,
                     client_data: tff.Computation) -> tff.Computation:
  """(model, client id, client state) -> output: `client_work` on the data that
  `client_data` (client id -> data) builds, inside the same TensorFlow graph.

  A dataset passed from one computation to another is serialized (`DatasetToGraphV2`)
  and re-imported under fresh function names at every call, and the TFF worker's
  pooled sessions keep the functions each import instantiates: measured +170 KB per
  client call, the worker growing ~4 MB per round at r = 20, without bound. Built in
  the client work's own graph, the data pipeline's functions keep their names, are
  instantiated once, and nothing is serialized.
  """
  model_type, data_type, state_type = client_work.type_signature.parameter
  if not data_type.is_assignable_from(client_data.type_signature.result):
    raise TypeError(f"the client data computation returns "
                    f"{client_data.type_signature.result}, the client work takes "
                    f"{data_type}")

  @tff.tensorflow.computation(model_type, client_data.type_signature.parameter,
                              state_type)
  def client_work_from_id(model, client_id, client_state):
    return client_work(model, client_data(client_id), client_state)

  return client_work_from_id


def compose_process(initial_model: tff.Computation, distributor,
                    client_work: tff.Computation, aggregator, finalizer,
                    dataset_type, client_state_type,
                    client_data: Optional[tff.Computation] = None
                    ) -> tff.templates.IterativeProcess:
  """The process of the module docstring.

  The state is an `api.ServerState`; `aggregator.next` must report the
  `rejected_updates` measurement. With
  `client_data` (client id -> data), `next` takes client ids instead of data and
  each client builds its data inside its client work (`with_client_data`).
  Split stages (`stages.is_split`) run fused (module docstring); others by
  composing their `next`s.
  """
  check_stages_fit(initial_model, distributor, client_work, aggregator, finalizer)
  if client_data is not None:
    client_work = with_client_data(client_work, client_data)
    dataset_type = client_data.type_signature.parameter

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(ServerState(
        tff.federated_eval(initial_model, tff.SERVER), distributor.initialize(),
        aggregator.initialize(), finalizer.initialize(),
        tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  weigh_metrics, with_measurements = _train_metric_computations(
      client_work.type_signature.result, aggregator.next.type_signature.result,
      finalizer.next.type_signature.result)
  if stages.is_split(distributor, aggregator, finalizer):
    next_fn = _fused_next(initialize.type_signature.result.member, distributor,
                          client_work, aggregator, finalizer, weigh_metrics,
                          with_measurements, dataset_type, client_state_type)
    return tff.templates.IterativeProcess(initialize, next_fn)

  @tff.federated_computation(initialize.type_signature.result,
                             tff.FederatedType(dataset_type, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(state, client_data, client_states):
    distributed = distributor.next(state.distributor, state.model)
    outputs = tff.federated_map(client_work,
                                (distributed.result, client_data, client_states))
    aggregated = aggregator.next(state.aggregator, outputs.update, outputs.update_weight)
    finalized = finalizer.next(state.finalizer, state.model, aggregated.result)
    new_state = tff.federated_zip(ServerState(
        finalized.result, distributed.state, aggregated.state, finalized.state,
        tff.federated_map(increment, state.round_num)))
    train_metrics = tff.federated_map(with_measurements, (
        tff.federated_sum(tff.federated_map(
            weigh_metrics, (outputs.metrics.loss, outputs.metrics.accuracy,
                            outputs.update_weight))),
        aggregated.measurements.rejected_updates,
        finalized.measurements.update_non_finite))
    metrics = collections.OrderedDict(train=train_metrics, clients=outputs.metrics)
    return new_state, outputs.client_state, metrics

  return tff.templates.IterativeProcess(initialize, next_fn)


def _fused_next(state_type, distributor: stages.SplitDistributor,
                client_work: tff.Computation, aggregator: stages.SplitAggregator,
                finalizer: stages.SplitFinalizer, weigh_metrics: tff.Computation,
                with_measurements: tff.Computation, dataset_type, client_state_type
                ) -> tff.Computation:
  """`next` of split stages in four computations (module docstring)."""

  @tff.tensorflow.computation(state_type)
  def payload(state):
    return distributor.server(state.distributor, state.model)[1]

  model_type, data_type, work_state_type = client_work.type_signature.parameter

  @tff.tensorflow.computation(model_type, data_type, work_state_type)
  def client(model, data, client_state):
    out = client_work(model, data, client_state)
    summand = collections.OrderedDict(
        update=aggregator.client(out["update"], out["update_weight"]),
        metrics=weigh_metrics(out["metrics"]["loss"], out["metrics"]["accuracy"],
                              out["update_weight"]))
    return summand, out["client_state"], out["metrics"]

  @tff.tensorflow.computation(state_type, client.type_signature.result[0])
  def server_update(state, sums):
    distributor_state, _, _ = distributor.server(state.distributor, state.model)
    aggregator_state, update, aggregated = aggregator.server(state.aggregator,
                                                             sums["update"])
    finalizer_state, model, finalized = finalizer.server(state.finalizer, state.model,
                                                         update)
    new_state = ServerState(model, distributor_state, aggregator_state, finalizer_state,
                            state.round_num + 1)
    return new_state, with_measurements(sums["metrics"], aggregated["rejected_updates"],
                                        finalized["update_non_finite"])

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(dataset_type, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(state, client_data, client_states):
    sent = tff.federated_broadcast(tff.federated_map(payload, state))
    summand, new_client_states, client_metrics = tff.federated_map(
        client, (sent, client_data, client_states))
    new_state, train_metrics = tff.federated_map(
        server_update, (state, tff.federated_sum(summand)))
    return new_state, new_client_states, collections.OrderedDict(
        train=train_metrics, clients=client_metrics)

  return next_fn


def _train_metric_computations(work_type, aggregator_type, finalizer_type):
  """The round's train metrics in one `federated_sum` (each reduction is a pass over the
  clients in the TFF runtime):

    weigh_metrics      at each client: (N_i l_i, N_i a_i, N_i, 1)
    with_measurements  at the server: loss = sum N_i l_i / sum N_i, accuracy likewise
                       (what `federated_mean` weighted by N_i computes), num_examples,
                       num_clients, and the aggregator's and finalizer's counters.
  """
  metric_type = work_type.metrics
  weight_type = work_type.update_weight

  @tff.tensorflow.computation(metric_type.loss, metric_type.accuracy, weight_type)
  def weigh_metrics(loss, accuracy, weight):
    return collections.OrderedDict(loss=loss * weight, accuracy=accuracy * weight,
                                   num_examples=weight, num_clients=np.int32(1))

  @tff.tensorflow.computation(weigh_metrics.type_signature.result,
                              aggregator_type.measurements.member.rejected_updates,
                              finalizer_type.measurements.member.update_non_finite)
  def with_measurements(sums, rejected_updates, update_non_finite):
    return collections.OrderedDict(
        loss=tf.math.divide_no_nan(sums["loss"], sums["num_examples"]),
        accuracy=tf.math.divide_no_nan(sums["accuracy"], sums["num_examples"]),
        num_examples=sums["num_examples"], num_clients=sums["num_clients"],
        rejected_updates=rejected_updates, update_non_finite=update_non_finite)

  return weigh_metrics, with_measurements


def compose_with_client_ids(dataset_computation: tff.Computation,
                            process: tff.templates.IterativeProcess
                            ) -> tff.templates.IterativeProcess:
  """`next(state, client_ids, client_states)`: each client builds its data from its id.

  Like `tff.simulation.compose_dataset_computation_with_iterative_process`, for any
  client data type (that one takes a single dataset; `evaluates_in_round` processes take
  OrderedDict(train=..., test=...)).
  """
  state_type, data_type, client_states_type = process.next.type_signature.parameter
  id_type = dataset_computation.type_signature.parameter
  if not data_type.member.is_equivalent_to(dataset_computation.type_signature.result):
    raise TypeError(f"the dataset computation returns "
                    f"{dataset_computation.type_signature.result}, the process takes "
                    f"{data_type.member}")

  @tff.federated_computation(state_type, tff.FederatedType(id_type, tff.CLIENTS),
                             client_states_type)
  def next_fn(state, client_ids, client_states):
    return process.next(state, tff.federated_map(dataset_computation, client_ids),
                        client_states)

  return tff.templates.IterativeProcess(process.initialize, next_fn)
