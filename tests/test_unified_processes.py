"""The unified optimizers' TFF processes against hand-written numpy references,
iterate for iterate, and their convergence against the central optimum."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from tests import unified_reference as ref
from tff_pflego.unified import constants, driver, registry, sampling, solver
from tff_pflego.unified.objectives import DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig

RULES = {  # name -> (momentum, variance reduced, frozen)
    "asvrcd_pfl": (True, True, False), "svrcd_pfl": (False, True, False),
    "ascd_pfl": (True, False, True), "scd_pfl": (False, False, True)}


def _problem(kind, m=3, n=7, d=4, seed=0, **kw):
  rng = np.random.default_rng(seed)
  x = rng.uniform(-1, 1, size=(m, n, d))
  data = DeviceData(x, rng.integers(0, 2, size=(m, n)).astype(np.int32))
  options = dict(penalty=0.4 if kind in ("mx2", "mt2") else 0.0, ridge=0.05,
                 global_features=2 if kind == "ews" else 0, alpha=1.5) | kw
  objective = Objective(kind, "logistic", m, d, **options)
  problem = dict(kind=kind, scale=objective.scale, lam=objective.penalty,
                 alpha=objective.alpha, ridge=objective.ridge, d_g=2, M=m, n=n,
                 d0=objective.global_dim, dl=objective.local_dim, x=x,
                 y=data.y.astype(np.float64))
  return objective, data, problem


def _params(objective, data, **overrides):
  block = constants.block_constants(objective, constants.curvatures(objective, data))
  params = constants.step_parameters(block, data.num_examples, p_w=overrides.pop("p_w", None))
  return dataclasses.replace(params, **overrides)


def _run(name, objective, data, params, rounds, seed=5, **config):
  algorithm = registry.build_optimizer(name, objective, data,
                                       OptimizerConfig(params, seed, **config))
  state, states = algorithm.process.initialize(), algorithm.initial_device_states
  all_metrics = []
  for _ in range(rounds):
    state, states, metrics = algorithm.process.next(state, algorithm.client_inputs,
                                                    states)
    all_metrics.append(metrics)
  return algorithm, state, states, all_metrics


@pytest.mark.parametrize("name,kind,frozen", [
    ("asvrcd_pfl", "mx2", True), ("asvrcd_pfl", "ews", True), ("svrcd_pfl", "mt2", True),
    ("ascd_pfl", "mx2", True), ("ascd_pfl", "mx2", False), ("ascd_pfl", "ews", False),
    ("scd_pfl", "mt2", True)])
def test_block_cd_processes_match_the_numpy_reference(name, kind, frozen):
  """8 communications (with p_w = 0.4 and rho = 0.3, so rounds hold local iterations,
  w steps, beta steps and refreshes): every block's y and z equal a numpy float64
  implementation of the spec's iteration to 1e-10, and the counted gradient
  evaluations equal the reference's."""
  objective, data, problem = _problem(kind)
  params = _params(objective, data, p_w=0.4, rho=0.3)
  rounds = 8
  algorithm, state, states, metrics = _run(name, objective, data, params, rounds,
                                           frozen=frozen)
  momentum, vr, _ = RULES[name]
  reference = ref.BlockCD(problem, params, momentum, vr, frozen if momentum else True, 5)
  for r in range(rounds):
    reference.run_round(r)
  assert algorithm.global_iterate(state) == pytest.approx(reference.w["y"], abs=1e-10)
  assert algorithm.local_iterates(states) == pytest.approx(
      np.stack([b["y"] for b in reference.b]), abs=1e-10)
  kinds = {(bool(m["schedule"]["step_w"]), bool(m["schedule"]["refresh"]))
           for m in metrics[1:]}
  assert (True, False) in kinds and (len(kinds) > 1 or not vr)
  local = sum(int(m["schedule"]["local_steps"]) for m in metrics)
  assert local > 0
  per_gradient = 2 if vr else 1
  refreshes = sum(int(m["schedule"]["refresh"]) for m in metrics) if vr else 0
  w_steps = sum(int(m["schedule"]["step_w"]) for m in metrics)
  m_, n = objective.num_devices, data.num_examples
  assert sum(int(m["counts"]["w_gradients"]) for m in metrics) == m_ * (
      per_gradient * w_steps + n * refreshes)
  initial = 1 if vr else 0  # round 0 of a VR method only computes G
  assert sum(int(m["counts"]["beta_gradients"]) for m in metrics) == m_ * (
      per_gradient * (local + rounds - initial - w_steps) + n * refreshes)


@pytest.mark.parametrize("reparametrize", [False, True])
def test_lsgd_without_local_block_is_fedavg(reparametrize):
  """LSGD-PFL on the FL objective (no beta) = FedAvg with full participation, client
  steps eta/M (eta/M^2 on u = w/sqrt(M) when reparametrized), server rate 1: the
  global model after each of 4 rounds of tau = 3 steps, to 1e-12."""
  objective, data, _ = _problem("fl", ridge=0.0, reparametrize=reparametrize)
  params = constants.StepParameters(p_w=1.0, rho=0.0, calL=1.0, eta=0.7, theta1=0.0,
                                    theta2=0.5, gamma=0.0, nu=1.0, theta_ascd=0.8)
  algorithm = registry.build_optimizer("lsgd_pfl", objective, data,
                                       OptimizerConfig(params, 5, local_steps=3))
  step = 0.7 / objective.num_devices * objective.scale ** 2
  history = ref.fedavg(data.x, data.y.astype(np.float64), step, 3, 4, 5)
  state, states = algorithm.process.initialize(), algorithm.initial_device_states
  for want in history:
    state, states, _ = algorithm.process.next(state, algorithm.client_inputs, states)
    assert objective.scale * algorithm.global_iterate(state) == pytest.approx(
        want, abs=1e-12)


def test_variance_reduction_reaches_1e_9_where_plain_methods_stall():
  """A small finite sum (MX2 + ridge, M = 3, n = 4), theory parameters, 500
  communications: ASVRCD and L2SGD+ reach F - F* <= 1e-9 F*; ASCD and SCD with the
  same step stay above 1e-4, their stochastic-gradient floor."""
  objective, data, _ = _problem("mx2", n=4, d=3, ridge=0.1)
  block = constants.block_constants(objective, constants.curvatures(objective, data))
  params = constants.step_parameters(block, data.num_examples)
  optimum = solver.solve(objective, data, strong_convexity=block.mu)
  assert optimum.gap_bound / optimum.value < 1e-12
  results = {}
  for name in ("asvrcd_pfl", "l2sgd_plus", "ascd_pfl", "scd_pfl"):
    algorithm = registry.build_optimizer(name, objective, data, OptimizerConfig(params, 3))
    summary = driver.run(algorithm, data, 500, optimum.value, eval_every=500)
    results[name] = summary["final"]["relative_suboptimality"]
  assert results["asvrcd_pfl"] < 1e-9 and results["l2sgd_plus"] < 1e-9, results
  assert results["ascd_pfl"] > 1e-4 and results["scd_pfl"] > 1e-4, results


@pytest.mark.parametrize("name", ["l2sgd_plus", "pfedme"])
def test_mx_baselines_match_the_numpy_reference(name):
  """L2SGD+ (p = 0.4, so rounds hold several local steps) and pFedMe, 5 communications
  on MX2: the reported w and every device's model equal a numpy float64
  implementation of spec section 3 to 1e-10."""
  objective, data, problem = _problem("mx2")
  params = _params(objective, data, p_w=0.4)
  algorithm, state, states, _ = _run(name, objective, data, params, 5)
  y = data.y.astype(np.float64)
  if name == "l2sgd_plus":
    w, betas = ref.l2sgd_plus(data.x, y, objective.penalty, objective.ridge, 0.4,
                              params.eta, objective.scale, 5, 5)
  else:
    w, betas = ref.pfedme(data.x, y, objective.penalty, objective.ridge, objective.scale,
                          5, 5)
  assert algorithm.global_iterate(state) == pytest.approx(w, abs=1e-10)
  assert algorithm.local_iterates(states) == pytest.approx(betas, abs=1e-10)


@pytest.mark.parametrize("name,frozen", [("ascd_pfl", True), ("ascd_pfl", False),
                                         ("asvrcd_pfl", True), ("scd_pfl", True)])
def test_reparametrized_and_plain_runs_map_iterate_for_iterate(name, frozen):
  """Spec test 4: the run on F(w/sqrt(M), beta) equals, with u = w/sqrt(M), the run on
  the plain F(u, beta) whose w-block estimate is scaled by 1/M (same step parameters,
  same draws), for 8 communications on MT2."""
  plain, data, _ = _problem("mt2", reparametrize=False)
  rescaled = dataclasses.replace(plain, reparametrize=True)
  params = _params(plain, data, p_w=0.4, rho=0.3)
  m = plain.num_devices
  alg_r, state_r, states_r, _ = _run(name, rescaled, data, params, 8, frozen=frozen)
  alg_p, state_p, states_p, _ = _run(name, plain, data, params, 8, frozen=frozen,
                                     w_gradient_scale=1.0 / m)
  assert rescaled.scale * alg_r.global_iterate(state_r) == pytest.approx(
      alg_p.global_iterate(state_p), abs=1e-12)
  assert alg_r.local_iterates(states_r) == pytest.approx(alg_p.local_iterates(states_p),
                                                         abs=1e-12)
  assert np.abs(alg_r.local_iterates(states_r)).max() > 1e-3  # the runs moved


# --- partial participation -----------------------------------------------------------

def _run_cohorts(name, objective, data, params, rounds, r, seed=5, **config):
  """The driver's loop: each round's cohort only, its states put back by device."""
  algorithm = registry.build_optimizer(
      name, objective, data, OptimizerConfig(params, seed, devices_per_round=r, **config))
  state, states = algorithm.process.initialize(), list(algorithm.initial_device_states)
  cohorts = []
  for round_num in range(rounds):
    cohort = algorithm.participants(round_num)
    cohorts.append(cohort)
    state, new, _ = algorithm.process.next(
        state, [algorithm.client_inputs[i] for i in cohort], [states[i] for i in cohort])
    for s in new:
      states[int(s["device"])] = s
  return algorithm, state, states, cohorts


@pytest.mark.parametrize("name,kind", [("ascd_pfl", "mx2"), ("scd_pfl", "mt2"),
                                       ("ascd_pfl", "ews")])
def test_partial_participation_matches_the_numpy_reference(name, kind):
  """2 of 4 devices per round, 10 rounds: the w estimate averages the cohort's parts,
  the cohort's beta estimates are divided by q = 1/2 and the others' beta stay put, in
  an independent numpy implementation, to 1e-10."""
  objective, data, problem = _problem(kind, m=4)
  params = _params(objective, data, p_w=0.4)
  algorithm, state, states, cohorts = _run_cohorts(name, objective, data, params, 10, 2)
  assert all(len(c) == 2 for c in cohorts) and len({tuple(c) for c in cohorts}) > 1
  momentum, vr, frozen = RULES[name]
  reference = ref.BlockCD(problem, params, momentum, vr, frozen, 5)
  for r, cohort in enumerate(cohorts):
    reference.run_round(r, cohort)
  assert algorithm.global_iterate(state) == pytest.approx(reference.w["y"], abs=1e-10)
  assert algorithm.local_iterates(states) == pytest.approx(
      np.stack([b["y"] for b in reference.b]), abs=1e-10)


def test_lsgd_partial_participation_matches_the_numpy_reference():
  objective, data, problem = _problem("mx2", m=4)
  params = _params(objective, data)
  algorithm, state, states, cohorts = _run_cohorts("lsgd_pfl", objective, data, params,
                                                   6, 3, local_steps=3)
  w, betas = ref.lsgd(problem, params.eta, 3, 6, 5, cohorts)
  assert algorithm.global_iterate(state) == pytest.approx(w, abs=1e-10)
  assert algorithm.local_iterates(states) == pytest.approx(betas, abs=1e-10)


def test_cohorts_are_uniform_and_reproducible():
  """Each device is in a round's cohort with probability r / M (4 standard errors over
  3000 rounds), cohorts hold r distinct devices and depend on (seed, round) only."""
  rounds, m, r = 3000, 5, 2
  cohorts = [sampling.cohort(7, t, m, r) for t in range(rounds)]
  assert all(len(set(c)) == r and all(0 <= i < m for i in c) for c in cohorts)
  assert cohorts[:20] == [sampling.cohort(7, t, m, r) for t in range(20)]
  assert cohorts[:20] != [sampling.cohort(8, t, m, r) for t in range(20)]
  q = r / m
  for i in range(m):
    frequency = np.mean([i in c for c in cohorts])
    assert abs(frequency - q) < 4 * np.sqrt(q * (1 - q) / rounds)


@pytest.mark.parametrize("name,frozen", [("asvrcd_pfl", True), ("svrcd_pfl", True),
                                         ("ascd_pfl", False), ("l2sgd_plus", True)])
def test_partial_participation_is_refused_where_it_would_be_wrong(name, frozen):
  objective, data, _ = _problem("mx2", m=4)
  with pytest.raises(ValueError, match="needs every device in every round"):
    registry.build_optimizer(name, objective, data, OptimizerConfig(
        _params(objective, data), 0, frozen=frozen, devices_per_round=2))


def test_a_run_removes_its_device_files(tmp_path, monkeypatch):
  """The clients' example files live as long as the run (a grid of runs in one
  process must not pile them up), also when the run fails."""
  import tempfile
  from tff_pflego.unified import experiment
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  config = experiment.UnifiedConfig(num_examples=20, num_devices=4, rounds=2)
  experiment.run(config)
  assert not [p for p in os.listdir(tmp_path) if p.startswith("tff_pflego_devices_")]

  def failing_run(*args, **kwargs):
    assert [p for p in os.listdir(tmp_path) if p.startswith("tff_pflego_devices_")]
    raise RuntimeError("lost worker")

  monkeypatch.setattr(driver, "run", failing_run)
  with pytest.raises(RuntimeError, match="lost worker"):
    experiment.run(config)
  assert not [p for p in os.listdir(tmp_path) if p.startswith("tff_pflego_devices_")]
