"""Client participation per round (spec section 2).

* fixed: r clients drawn uniformly without replacement;
* binomial: every client joins independently with probability pi.
Either way P(i in I_t) = q, which the algorithm's estimator divides by.
"""

from __future__ import annotations

import numpy as np


class ClientSampler:
  """Seeded participation; `state`/`set_state` make it checkpointable."""

  def __init__(self, num_clients: int, *, clients_per_round: int | None = None,
               participation_prob: float | None = None, seed: int = 0):
    if (clients_per_round is None) == (participation_prob is None):
      raise ValueError("give exactly one of clients_per_round, participation_prob")
    if clients_per_round is not None and not 1 <= clients_per_round <= num_clients:
      raise ValueError(f"clients_per_round must be in 1..{num_clients}")
    if participation_prob is not None and not 0 < participation_prob <= 1:
      raise ValueError("participation_prob must be in (0, 1]")
    self.num_clients = num_clients
    self.clients_per_round = clients_per_round
    self._pi = participation_prob
    self._rng = np.random.default_rng([seed, 7919])

  @property
  def participation_prob(self) -> float:
    """q = P(i in I_t): r / I, or pi."""
    if self._pi is not None:
      return self._pi
    return self.clients_per_round / self.num_clients

  def sample(self) -> np.ndarray:
    """Indices of the clients of the next round, sorted."""
    if self._pi is not None:
      return np.flatnonzero(self._rng.random(self.num_clients) < self._pi)
    return np.sort(self._rng.choice(self.num_clients, self.clients_per_round,
                                    replace=False))

  @property
  def state(self) -> dict:
    return self._rng.bit_generator.state

  def set_state(self, state: dict) -> None:
    self._rng.bit_generator.state = state
