"""The per-client timings that `binaries/profile_round.py` splits a round with.

Run one client computation at a time (`max_concurrent_computation_calls=1`), each
client's in-graph interval [start, end] lies inside the round and apart from the
others', so

  sum_i client_time_s_i  <=  the round's wall time (measured in Python)

and `outside clients = round - sum_i client_time_s_i` (`instrumentation.split_round`) is not
negative; within a client, `client_compute_s <= client_time_s`. With the clients in
parallel (every run's round) the intervals overlap and the same sum exceeds the round:
the check below tells the two apart, so the split is valid only in the first mode.
"""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

from tests import helpers
from tff_pflego import runtime
from tff_pflego.algorithms import instrumentation, packed_metrics, registry

SIZES, NUM_CLASSES = (200,) * 8, (3,) * 8
TIMED_ROUNDS = 3


def _timed_rounds(algorithm, data: list, max_concurrent_computation_calls: int
                  ) -> list[tuple[float, list, list]]:
  """(round wall time, clients' whole times, clients' compute times) of rounds of
  `algorithm` on `data` after one untimed round, on a private worker."""
  states = [algorithm.initial_client_state(i, k) for i, k in enumerate(NUM_CLASSES)]
  rounds = []
  with runtime.local_execution_context(
      max_concurrent_computation_calls=max_concurrent_computation_calls):
    next_round = packed_metrics.unpacking_next(algorithm.process)
    state = algorithm.process.initialize()
    for _ in range(TIMED_ROUNDS + 1):
      start = time.monotonic()
      state, states, metrics = next_round(state, data, states)
      elapsed = time.monotonic() - start
      rounds.append((elapsed, [float(c["client_time_s"]) for c in metrics["clients"]],
                     [float(c["client_compute_s"]) for c in metrics["clients"]]))
  return rounds[1:]


def test_one_client_at_a_time_splits_the_round_and_parallel_clients_do_not():
  # FedAvg with 100 local steps a client: the clients' work fills the round.
  algorithm = registry.build_algorithm(
      "fedavg", helpers.algorithm_config(local_steps=100, total_examples=sum(SIZES)))
  assert algorithm.evaluates_in_round
  data = [collections.OrderedDict(train=d, test=d) for d in (
      helpers.as_dataset(x, y, batch_size=16)
      for x, y in helpers.synthetic_clients(SIZES, NUM_CLASSES))]
  one_at_a_time = _timed_rounds(algorithm, data, 1)
  for elapsed, whole, compute in one_at_a_time:
    assert len(whole) == len(SIZES)
    assert all(0.0 < c <= w for c, w in zip(compute, whole)), (compute, whole)
    assert sum(whole) <= elapsed, (f"clients run one at a time took {sum(whole):.3f} s "
                                   f"in a {elapsed:.3f} s round")
    instrumentation.split_round(elapsed, whole, compute)  # accepted: no overlap
  parallel = _timed_rounds(algorithm, data, -1)
  overlap = [sum(whole) / elapsed for elapsed, whole, _ in parallel]
  # Measured 2026-11-29: 2.0-3.7 in parallel, 0.70-0.83 one at a time.
  assert max(overlap) > 1.0, overlap
  elapsed, whole, compute = parallel[int(np.argmax(overlap))]
  with pytest.raises(ValueError, match="overlapped"):
    instrumentation.split_round(elapsed, whole, compute)
  print("sum of client times / round:",
        [round(sum(w) / e, 2) for e, w, _ in one_at_a_time], "one at a time;",
        np.round(overlap, 2).tolist(), "in parallel")


def test_split_round_parts_add_up_to_the_round():
  # Three clients, one after another, in a 1 s round: whole 0.25 + 0.125 + 0.0625,
  # of which 0.0625 + 0.0625 + 0.03125 after their data was in memory.
  split = instrumentation.split_round(1.0, [0.25, 0.125, 0.0625], [0.0625, 0.0625, 0.03125])
  assert split == instrumentation.RoundSplit(
      data_s=0.28125, compute_s=0.15625, outside_clients_s=0.5625)
  assert sum(split) == 1.0


@pytest.mark.parametrize("round_s, whole, compute, problem", [
    (0.3, [0.25, 0.125], [0.1, 0.1], "overlapped"),  # times sum past the round
    (1.0, [0.25, 0.125], [0.3, 0.1], "longer"),      # computed longer than it ran
    (1.0, [0.25, 0.125], [-0.1, 0.1], "negative"),   # a negative compute time
    (1.0, [0.25, 0.125], [0.1], "compute times"),    # one compute time missing
])
def test_split_round_refuses_times_that_cannot_be_one_after_another(round_s, whole,
                                                                   compute, problem):
  with pytest.raises(ValueError, match=problem):
    instrumentation.split_round(round_s, whole, compute)
