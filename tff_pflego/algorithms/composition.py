"""One round of any algorithm here, composed like `tff.learning`'s processes.

  next(state, client_data, client_states):
    distributor   broadcast the server's model to the sampled clients
    client work   each client: (model, dataset, client state) -> update, weight, new
                  client state, metrics
    aggregator    the clients' updates -> the server's step direction
    finalizer     model <- optimizer(model, step direction)
  -> (new state, new client states @CLIENTS, metrics {train @SERVER, clients @CLIENTS})

The algorithms differ only in their parts (`pflego.py`, `averaging.py`).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Type

import numpy as np
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class ClientDataComputations:
  """How clients build their data from their ids: TFF computations client id -> data.

  An algorithm's builder takes the one its client work reads.
  """
  train: tff.Computation  # -> the client's train dataset
  train_and_test: tff.Computation  # -> OrderedDict(train=dataset, test=dataset)


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


def compose_process(state_cls: Type, initial_model: tff.Computation, distributor,
                    client_work: tff.Computation, aggregator, finalizer,
                    dataset_type, client_state_type,
                    client_data: Optional[tff.Computation] = None
                    ) -> tff.templates.IterativeProcess:
  """The process of the module docstring.

  `state_cls` is a NamedTuple (model, distributor, aggregator, finalizer, round_num);
  `aggregator.next` must report the `rejected_updates` measurement. With
  `client_data` (client id -> data), `next` takes client ids instead of data and
  each client builds its data inside its client work (`with_client_data`).
  """
  if client_data is not None:
    client_work = with_client_data(client_work, client_data)
    dataset_type = client_data.type_signature.parameter

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(state_cls(
        tff.federated_eval(initial_model, tff.SERVER), distributor.initialize(),
        aggregator.initialize(), finalizer.initialize(),
        tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  @tff.federated_computation(initialize.type_signature.result,
                             tff.FederatedType(dataset_type, tff.CLIENTS),
                             tff.FederatedType(client_state_type, tff.CLIENTS))
  def next_fn(state, client_data, client_states):
    model = state[0]
    distributed = distributor.next(state.distributor, model)
    outputs = tff.federated_map(client_work,
                                (distributed.result, client_data, client_states))
    aggregated = aggregator.next(state.aggregator, outputs.update, outputs.update_weight)
    finalized = finalizer.next(state.finalizer, model, aggregated.result)
    new_state = tff.federated_zip(state_cls(
        finalized.result, distributed.state, aggregated.state, finalized.state,
        tff.federated_map(increment, state.round_num)))
    train_metrics = tff.federated_zip(collections.OrderedDict(
        loss=tff.federated_mean(outputs.metrics.loss, outputs.update_weight),
        accuracy=tff.federated_mean(outputs.metrics.accuracy, outputs.update_weight),
        num_examples=tff.federated_sum(outputs.update_weight),
        num_clients=tff.federated_sum(tff.federated_value(np.int32(1), tff.CLIENTS)),
        rejected_updates=aggregated.measurements.rejected_updates,
        update_non_finite=finalized.measurements.update_non_finite))
    metrics = collections.OrderedDict(train=train_metrics, clients=outputs.metrics)
    return new_state, outputs.client_state, metrics

  return tff.templates.IterativeProcess(initialize, next_fn)


def compose_with_client_ids(dataset_computation: tff.Computation,
                            process: tff.templates.IterativeProcess
                            ) -> tff.templates.IterativeProcess:
  """`next(state, client_ids, client_states)`: each client builds its data from its id.

  Like `tff.simulation.compose_dataset_computation_with_iterative_process`, for any
  client data type (that one takes a single dataset; `local_evaluation` processes take
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
