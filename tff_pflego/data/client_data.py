"""How a client builds its data from its id, as TFF computations."""

from __future__ import annotations

import dataclasses

import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class ClientDataComputations:
  """How clients build their data from their ids: TFF computations client id -> data.

  An algorithm's builder takes the one its client work reads.
  """
  train: tff.Computation  # -> the client's train dataset
  train_and_test: tff.Computation  # -> OrderedDict(train=dataset, test=dataset)
