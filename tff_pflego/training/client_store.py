"""The clients' personal state (heads) kept by the simulation between rounds.

In deployment each client keeps its own head; in simulation the driver keeps them
here, keyed by client index, created on a client's first visit and matched back by the
`client_index` each client returns (runtimes may reorder CLIENTS-placed results). A
returned state holding NaN or Inf is refused: the client keeps its previous state.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf


def _is_finite(state: collections.OrderedDict) -> bool:
  return all(np.all(np.isfinite(leaf)) for leaf in tf.nest.flatten(state)
             if np.issubdtype(np.asarray(leaf).dtype, np.floating))


class ClientStateStore:

  def __init__(self, initial_state_fn: Callable[[int], collections.OrderedDict]):
    self._initial_state_fn = initial_state_fn
    self._states: dict[int, collections.OrderedDict] = {}

  def get(self, indices: Iterable[int]) -> list[collections.OrderedDict]:
    """The states of `indices`, creating those of first-time clients."""
    states = []
    for i in indices:
      i = int(i)
      if i not in self._states:
        self._states[i] = self._initial_state_fn(i)
      states.append(self._states[i])
    return states

  def update(self, states: Sequence[collections.OrderedDict],
             expected: Iterable[int]) -> int:
    """Stores returned states by their `client_index`; they must be the expected ones.

    Returns the number of states refused because they hold NaN or Inf.
    """
    returned = sorted(int(s["client_index"]) for s in states)
    if returned != sorted(int(i) for i in expected):
      raise RuntimeError(f"clients returned states for {returned}, expected "
                         f"{sorted(int(i) for i in expected)}")
    refused = 0
    for s in states:
      if _is_finite(s):
        self._states[int(s["client_index"])] = s
      else:
        refused += 1
    return refused

  def snapshot(self) -> dict[int, collections.OrderedDict]:
    """The states of the clients seen so far (a shallow copy; states are immutable)."""
    return dict(self._states)

  def restore(self, states: Mapping[int, collections.OrderedDict]) -> None:
    self._states = dict(states)

  def __len__(self) -> int:
    return len(self._states)
