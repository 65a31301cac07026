"""Faults: dropout keeps the estimator unbiased; NaN/Inf updates are rejected and counted."""

from __future__ import annotations

import collections
import itertools

import numpy as np

from tests import helpers
from tests.helpers import BETA, MAX_CLASSES, subset_estimate
from tests.helpers import pflego_process as build
from tff_pflego.training.client_store import ClientStateStore
from tff_pflego.training.sampling import ClientSampler


def test_dropout_estimator_is_unbiased_over_all_subsets_and_reports():
  sizes, num_classes = (4, 7, 9, 6), (2, 2, 3, 3)
  r, dropout = 2, 0.25
  data = helpers.synthetic_clients(sizes, num_classes, seed=3)
  sampler = ClientSampler(4, clients_per_round=r, dropout_prob=dropout)
  assert sampler.participation_prob == 0.5 * 0.75
  process = build(4, sampler.participation_prob, local_steps=2, total_examples=sum(sizes))
  state = process.initialize()
  states = helpers.client_states(num_classes, MAX_CLASSES)
  theta = [np.asarray(w) for w in state.model.trainable]
  exact, _, _ = helpers.central_gradients(theta, [s["head"] for s in states],
                                          num_classes, data, presteps=1, lr=BETA)

  # P(reports = R) = sum over selected sets S >= R of P(S) d^|S - R| (1 - d)^|R|.
  prob = collections.defaultdict(float)
  selections = list(itertools.combinations(range(4), r))
  for selected in selections:
    for mask in itertools.product([0, 1], repeat=r):
      reports = tuple(i for i, m in zip(selected, mask) if m)
      prob[reports] += (dropout ** (r - sum(mask)) * (1 - dropout) ** sum(mask)
                        / len(selections))
  assert abs(sum(prob.values()) - 1) < 1e-12
  expectation = [np.zeros_like(g) for g in exact]
  for reports, p in prob.items():
    if not reports:
      continue  # nobody reports: the estimate is 0
    estimate, _ = subset_estimate(process, state, data, states, reports)
    expectation = [a + p * e for a, e in zip(expectation, estimate)]
  for got, g in zip(expectation, exact):
    np.testing.assert_allclose(got, g, atol=2e-5, rtol=1e-4)
  # Ignoring dropout (dividing by q alone) is biased: the test can fail.
  assert not np.allclose([0.75 * e for e in expectation[0]], exact[0], atol=1e-4)


def test_sampler_dropout_frequency_and_determinism():
  a = ClientSampler(10, clients_per_round=4, dropout_prob=0.3, seed=5)
  b = ClientSampler(10, clients_per_round=4, dropout_prob=0.3, seed=5)
  counts = np.zeros(10)
  for _ in range(4000):
    reports = a.sample()
    np.testing.assert_array_equal(reports, b.sample())
    assert len(a.last_selected) == 4 and set(reports) <= set(a.last_selected)
    counts[reports] += 1
  np.testing.assert_allclose(counts / 4000, 0.4 * 0.7, atol=0.03)


def _with_nan(data, client):
  x, y = data[client]
  x = x.copy()
  x[0, 0, 0, 0] = np.nan
  data = list(data)
  data[client] = (x, y)
  return data


def test_non_finite_update_is_rejected_and_the_round_goes_on_without_it():
  sizes, num_classes = (5, 8, 11), (2, 3, 3)
  data = helpers.synthetic_clients(sizes, num_classes, seed=4)
  process = build(3, 1.0, local_steps=2, total_examples=sum(sizes))
  state = process.initialize()
  states = helpers.client_states(num_classes, MAX_CLASSES)

  poisoned = _with_nan(data, 1)
  new_state, new_states, metrics = process.next(
      state, [helpers.as_dataset(*d) for d in poisoned], states)
  assert int(metrics["train"]["rejected_updates"]) == 1
  assert int(metrics["train"]["update_non_finite"]) == 0
  without, _, _ = process.next(state, [helpers.as_dataset(*data[i]) for i in (0, 2)],
                               [states[i] for i in (0, 2)])
  for got, want in zip(new_state.model.trainable, without.model.trainable):
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=1e-7)
  # ...and it differs from the round with the honest client 1 (the test can fail).
  honest, _, _ = process.next(state, [helpers.as_dataset(*d) for d in data], states)
  assert not np.allclose(honest.model.trainable[0], without.model.trainable[0], atol=1e-6)

  # The driver's store refuses the poisoned client's non-finite head.
  store = ClientStateStore(lambda i: states[i])
  before = store.get([0, 1, 2])
  assert store.update(new_states, [0, 1, 2]) == 1
  np.testing.assert_array_equal(store.get([1])[0]["head"]["kernel"],
                                before[1]["head"]["kernel"])
  by_index = {int(s["client_index"]): s for s in new_states}
  np.testing.assert_array_equal(store.get([0])[0]["head"]["kernel"],
                                by_index[0]["head"]["kernel"])
