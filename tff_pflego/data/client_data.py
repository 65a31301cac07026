"""How a client builds its data from its id, as TFF computations."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class ClientDataComputations:
  """How clients build their data from their ids: TFF computations client id -> data.

  An algorithm's builder takes the one its client work reads.
  """
  train: tff.Computation  # -> the client's train dataset
  train_and_test: tff.Computation  # -> OrderedDict(train=dataset, test=dataset)


def client_data_computations(train: tff.simulation.datasets.ClientData,
                             test: tff.simulation.datasets.ClientData
                             ) -> ClientDataComputations:
  """The computations of a train and a test `ClientData` with the same client ids.

  `train_and_test` serves processes that evaluate each client's local model on its test
  data right after its update, inside the round
  (`PersonalizedAlgorithm.evaluates_in_round`).
  """
  train_fn, test_fn = train.serializable_dataset_fn, test.serializable_dataset_fn

  @tff.tensorflow.computation(np.str_)
  def train_and_test(client_id):
    return collections.OrderedDict(train=train_fn(client_id), test=test_fn(client_id))

  return ClientDataComputations(train.dataset_computation, train_and_test)
