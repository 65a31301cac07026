"""The clients' personal state (heads) kept by the simulation between rounds.

In deployment each client keeps its own head; in simulation the driver keeps them
here, keyed by client index, created on a client's first visit and matched back by the
`client_index` each client returns (runtimes may reorder CLIENTS-placed results).
"""

from __future__ import annotations

import collections
from typing import Callable, Iterable, Sequence


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
             expected: Iterable[int]) -> None:
    """Stores returned states by their `client_index`; they must be the expected ones."""
    returned = sorted(int(s["client_index"]) for s in states)
    if returned != sorted(int(i) for i in expected):
      raise RuntimeError(f"clients returned states for {returned}, expected "
                         f"{sorted(int(i) for i in expected)}")
    for s in states:
      self._states[int(s["client_index"])] = s

  def __len__(self) -> int:
    return len(self._states)
