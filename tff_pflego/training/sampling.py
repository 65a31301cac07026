"""Client participation per round (spec section 2), with optional dropout.

* fixed: r clients drawn uniformly without replacement;
* binomial: every client joins independently with probability pi.
Either way P(i selected) = q. With dropout d, each selected client independently fails
to report (it does no work and its personal state is unchanged), so the probability
that a client's update reaches the server is q (1 - d): the `participation_prob` the
algorithm's estimator divides by, which keeps it unbiased.
"""

from __future__ import annotations

import numpy as np


class ClientSampler:
  """Seeded participation; `state`/`set_state` make it checkpointable."""

  def __init__(self, num_clients: int, *, clients_per_round: int | None = None,
               participation_prob: float | None = None, dropout_prob: float = 0.0,
               seed: int = 0):
    if (clients_per_round is None) == (participation_prob is None):
      raise ValueError("give exactly one of clients_per_round, participation_prob")
    if clients_per_round is not None and not 1 <= clients_per_round <= num_clients:
      raise ValueError(f"clients_per_round must be in 1..{num_clients}")
    if participation_prob is not None and not 0 < participation_prob <= 1:
      raise ValueError("participation_prob must be in (0, 1]")
    if not 0 <= dropout_prob < 1:
      raise ValueError("dropout_prob must be in [0, 1)")
    self.num_clients = num_clients
    self.clients_per_round = clients_per_round
    self.dropout_prob = dropout_prob
    self._pi = participation_prob
    self._rng = np.random.default_rng([seed, 7919])
    self.last_selected = np.zeros(0, np.int64)

  @property
  def selection_prob(self) -> float:
    """q = P(i in I_t): r / I, or pi."""
    if self._pi is not None:
      return self._pi
    return self.clients_per_round / self.num_clients

  @property
  def participation_prob(self) -> float:
    """P(client i's update reaches the server) = q (1 - dropout)."""
    return self.selection_prob * (1.0 - self.dropout_prob)

  def sample(self) -> np.ndarray:
    """Indices of the next round's clients that report, sorted.

    `last_selected` keeps all the clients selected, including those that dropped out.
    """
    if self._pi is not None:
      selected = np.flatnonzero(self._rng.random(self.num_clients) < self._pi)
    else:
      selected = np.sort(self._rng.choice(self.num_clients, self.clients_per_round,
                                          replace=False))
    self.last_selected = selected
    if self.dropout_prob > 0:
      return selected[self._rng.random(len(selected)) >= self.dropout_prob]
    return selected

  @property
  def state(self) -> dict:
    return self._rng.bit_generator.state

  def set_state(self, state: dict) -> None:
    self._rng.bit_generator.state = state
