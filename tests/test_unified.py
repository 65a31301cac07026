"""The unified framework against independent computations: closed forms, exhaustive
expectations, a central float64 optimum and hand-written numpy references."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import scipy.optimize
import tensorflow as tf

from tests import unified_reference as ref
from tff_pflego.unified import (ascd_pfl, asvrcd_pfl, block_cd, constants, objectives,
                                sampling, scd_pfl, solver, svrcd_pfl)
from tff_pflego.unified.objectives import DTYPE, DeviceData, Objective


def _data(m=3, n=6, d=4, seed=0, classes=2, unit_rows=False) -> DeviceData:
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(m, n, d))
  if unit_rows:
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
  return DeviceData(x, rng.integers(0, classes, size=(m, n)).astype(np.int32))


def _objective(kind, data, **kw) -> Objective:
  defaults = dict(penalty=0.3 if kind in ("mt2", "mx2", "apfl2") else 0.0, ridge=0.05)
  if kind == "ews":
    defaults["global_features"] = 2
  if kind == "apfl2":
    defaults["mixture"] = 0.3
  return Objective(kind, kw.pop("loss", "logistic"), data.num_devices,
                   data.x.shape[-1], **(defaults | kw))


def _flat_hessian(objective, data, flat):
  x, y = tf.constant(data.x, DTYPE), tf.constant(data.y)
  d0, m, dl = objective.global_dim, objective.num_devices, objective.local_dim
  flat = tf.constant(flat, DTYPE)
  with tf.GradientTape() as outer:
    outer.watch(flat)
    with tf.GradientTape() as inner:
      inner.watch(flat)
      w, betas = flat[:d0], tf.reshape(flat[d0:], [m, dl])
      value = tf.add_n([objective.device_loss(w, betas[i], x[i], y[i])
                        for i in range(m)]) / m
    gradient = inner.gradient(value, flat)
  return outer.jacobian(gradient, flat).numpy()


# --- constants ---------------------------------------------------------------------

@pytest.mark.parametrize("kind,loss", [
    ("fl", "logistic"), ("local", "logistic"), ("mt2", "logistic"), ("mx2", "logistic"),
    ("apfl2", "logistic"), ("ews", "logistic"), ("mx2", "softmax"), ("mt2", "softmax"),
    ("apfl2", "softmax"), ("mt2:alpha=3", "logistic"), ("mt2:alpha=0.2", "softmax")])
@pytest.mark.parametrize("reparametrize", [True, False])
def test_constants_bound_numerical_hessians(kind, loss, reparametrize):
  """lambda_max of the w and beta blocks of the Hessian of F <= L_w, L_beta and
  lambda_min of the whole Hessian >= mu, at random points; the same for one example's
  component (calligraphic constants). The bounds are also near-tight for mu."""
  softmax = loss == "softmax"
  data = _data(d=3 if softmax else 4, classes=3 if softmax else 2)
  kind, _, alpha = kind.partition(":alpha=")  # MT2's relaxation (spec 4.6)
  objective = _objective(kind, data, reparametrize=reparametrize, loss=loss,
                         **(dict(num_classes=3) if softmax else {}),
                         **(dict(alpha=float(alpha)) if alpha else {}))
  block = constants.block_constants(objective, constants.curvatures(objective, data))
  d0, m = objective.global_dim, objective.num_devices
  size = d0 + m * objective.local_dim
  rng = np.random.default_rng(1)
  for _ in range(3):
    hessian = _flat_hessian(objective, data, rng.normal(size=size))
    eig = np.linalg.eigvalsh
    if d0:
      assert eig(hessian[:d0, :d0])[-1] <= block.L_w * (1 + 1e-9)
    if objective.local_dim:
      assert eig(hessian[d0:, d0:])[-1] <= block.L_beta * (1 + 1e-9)
    assert eig(hessian)[0] >= block.mu * (1 - 1e-9)
  one = DeviceData(data.x[:, :1], data.y[:, :1])
  one_block = constants.block_constants(objective, constants.curvatures(objective, one))
  hessian = _flat_hessian(objective, one, rng.normal(size=size))
  if d0:
    assert np.linalg.eigvalsh(hessian[:d0, :d0])[-1] <= block.calL_w * (1 + 1e-9)
  assert one_block.L_w == pytest.approx(one_block.calL_w)


def test_constants_are_exact_on_a_quadratic():
  """With the data term removed (x = 0 rows) F is a quadratic whose f~ curvature is the
  ridge exactly: the Hessian's smallest eigenvalue is mu and its blocks' largest are
  L_w and L_beta, with and without the reparametrization."""
  data = DeviceData(np.zeros((4, 3, 2)), np.zeros((4, 3), np.int32))
  for kind, reparametrize in itertools.product(("mx2", "mt2", "apfl2"), (True, False)):
    objective = _objective(kind, data, ridge=0.2, reparametrize=reparametrize)
    block = constants.block_constants(objective, constants.curvatures(objective, data))
    size = objective.global_dim + 4 * objective.local_dim
    hessian = _flat_hessian(objective, data, np.zeros(size))
    d0 = objective.global_dim
    eig = np.linalg.eigvalsh
    assert eig(hessian)[0] == pytest.approx(block.mu, rel=1e-9), kind
    assert eig(hessian[:d0, :d0])[-1] == pytest.approx(block.L_w, rel=1e-9), kind
    assert eig(hessian[d0:, d0:])[-1] == pytest.approx(block.L_beta, rel=1e-9), kind


def test_parameter_table_of_the_real_data_runs():
  """Spec 4.3's table (p_w, eta, theta1, ASCD's theta), from L' = 1 (unit rows, softmax
  with bias) and the paper's heuristic mu, to 1e-3 (the table prints 3-4 digits)."""
  table = {("mt2", 2): (0.5, 0.833, 0.5, 0.8), ("mt2", 4): (0.5, 1.0, 0.5, 0.8),
           ("mt2", 8): (0.5, 1.111, 0.5, 0.8), ("mx2", 2): (0.25, 1.25, 0.204, 0.8),
           ("mx2", 4): (0.167, 1.667, 0.289, 0.6), ("mx2", 8): (0.1, 2.0, 0.408, 0.5),
           ("apfl2", 2): (0.555, 1.374, None, None), ("apfl2", 4): (0.619, 1.488, None, None),
           ("apfl2", 8): (0.763, 1.645, None, None)}
  # One device whose example has |x| = 1 pins L' = |[x; 1]|^2 / 2 = 1 exactly.
  x = np.zeros((20, 1, 5))
  x[:, 0, 0] = 1.0
  data = DeviceData(x, np.zeros((20, 1), np.int32))
  for (kind, c), (p_w, eta, theta1, theta) in table.items():
    kw = dict(penalty=1.0 / c) if kind != "apfl2" else dict(penalty=1.0, mixture=0.05 * c)
    objective = Objective(kind, "softmax", 20, 5, num_classes=10, **kw)
    curv = constants.curvatures(objective, data)
    assert curv.smooth_one == pytest.approx(1.0)
    params = constants.step_parameters(constants.block_constants(objective, curv), 100,
                                       mu=constants.paper_mu(objective))
    assert params.p_w == pytest.approx(p_w, abs=1e-3), (kind, c)
    assert params.eta == pytest.approx(eta, abs=1e-3), (kind, c)
    if theta1 is not None:
      assert params.theta1 == pytest.approx(theta1, abs=1e-3), (kind, c)
      assert params.theta_ascd == pytest.approx(theta, abs=1e-3), (kind, c)


# --- the objective family ----------------------------------------------------------

def test_mx2_minimizer_is_the_mixture_problem():
  """argmin of (11): w*/sqrt(M) = mean_m beta*_m, and min (11) = min (9), the mixture
  objective (1/M) sum f~(x_m) + (lam/2M) sum |x_m - mean x|^2 solved separately."""
  data = _data(m=4, n=8, d=3)
  objective = _objective("mx2", data, penalty=0.7)
  optimum = solver.solve(objective, data)
  assert optimum.w * objective.scale == pytest.approx(optimum.betas.mean(0), abs=1e-8)
  m, d, lam, ridge = 4, 3, 0.7, objective.ridge

  def mixture(flat):
    xm = flat.reshape(m, d)
    mean = xm.mean(0)
    value = sum(np.mean(np.logaddexp(0, data.x[i] @ xm[i]) - data.y[i] * (data.x[i] @ xm[i]))
                + 0.5 * ridge * xm[i] @ xm[i] for i in range(m)) / m
    return value + lam / (2 * m) * np.sum((xm - mean) ** 2)

  best = scipy.optimize.minimize(mixture, np.zeros(m * d), method="BFGS",
                                 options=dict(gtol=1e-12))
  assert optimum.value == pytest.approx(best.fun, rel=1e-9)


def test_solver_reaches_the_optimum_to_1e_10():
  """The certificate |grad|^2 / (2 mu) bounds F - F* below 1e-10 relative, and no
  perturbation of the minimizer is lower."""
  data = _data(m=3, n=10, d=3)
  objective = _objective("mt2", data, ridge=0.1)
  block = constants.block_constants(objective, constants.curvatures(objective, data))
  optimum = solver.solve(objective, data, strong_convexity=block.mu)
  assert optimum.gap_bound / optimum.value < 1e-10
  rng = np.random.default_rng(0)
  for _ in range(5):
    w = optimum.w + 1e-4 * rng.normal(size=optimum.w.shape)
    betas = optimum.betas + 1e-4 * rng.normal(size=optimum.betas.shape)
    assert objectives.objective_value(objective, w, betas, data) > optimum.value


@pytest.mark.parametrize("n,d", [(5, 12), (12, 5)])
def test_largest_gram_eigenvalue_from_the_smaller_gram(n, d):
  """max_m lambda_max(X_m^T X_m) / n, whichever Gram matrix is decomposed."""
  x = np.random.default_rng(1).normal(size=(3, n, d))
  want = max(np.linalg.eigvalsh(xm.T @ xm)[-1] for xm in x) / n
  assert constants._largest_gram_eigenvalue(x) == pytest.approx(want, rel=1e-12)


def test_solve_once_shares_an_optimum_only_within_one_problem(monkeypatch):
  """Equal objective and data: one solve; a changed example or penalty: a new one,
  equal to solving from scratch."""
  monkeypatch.setattr(solver, "_SOLVED", {})
  solve, calls = solver.solve, []
  monkeypatch.setattr(solver, "solve",
                      lambda *args, **kw: calls.append(args) or solve(*args, **kw))
  data = _data(m=2, n=5, d=3, seed=7)
  objective = _objective("mx2", data)
  first = solver.solve_once(objective, data, 0.05)
  again = solver.solve_once(objective, DeviceData(data.x.copy(), data.y.copy()), 0.05)
  assert again is first and len(calls) == 1
  assert not first.w.flags.writeable and not first.betas.flags.writeable
  x = data.x.copy()
  x[1, 2, 0] += 1e-3
  moved = DeviceData(x, data.y)
  other = solver.solve_once(objective, moved, 0.05)
  assert len(calls) == 2 and other.value != first.value
  assert other.value == solve(objective, moved, 0.05).value
  stronger = dataclasses.replace(objective, penalty=0.6)
  assert solver.solve_once(stronger, data, 0.05).value == solve(stronger, data, 0.05).value
  assert len(calls) == 3


# --- estimators ----------------------------------------------------------------------

def _central_gradient(objective, data, w, betas):
  x, y = tf.constant(data.x, DTYPE), tf.constant(data.y)
  w, betas = tf.constant(w), tf.constant(betas)
  with tf.GradientTape() as tape:
    tape.watch([w, betas])
    value = tf.add_n([objective.device_loss(w, betas[i], x[i], y[i])
                      for i in range(objective.num_devices)]) / objective.num_devices
  g_w, g_b = tape.gradient(value, [w, betas])
  return g_w.numpy(), g_b.numpy()


@pytest.mark.parametrize("name", ["asvrcd_pfl", "ascd_pfl", "svrcd_pfl", "scd_pfl"])
@pytest.mark.parametrize("kind", ["mx2", "ews"])
def test_gradient_estimators_are_unbiased_by_enumeration(name, kind):
  """E over the block (w w.p. p_w) and every device's example (all n^M choices) of the
  estimate that steps the sampled block = grad F(x), to 1e-12, at random states."""
  data = _data(m=2, n=3, d=4)
  objective = _objective(kind, data)
  params = constants.StepParameters(p_w=0.3, rho=0.1, calL=1.0, eta=0.5, theta1=0.3,
                                    theta2=0.5, gamma=0.2, nu=0.9, theta_ascd=0.4)
  rule = {"asvrcd_pfl": block_cd.BlockRule(0.5, 0.3, True, True, theta1=0.3, theta2=0.5,
                                           gamma=0.2, nu=0.9, rho=0.1),
          "svrcd_pfl": block_cd.BlockRule(0.5, 0.3, False, True, rho=0.1),
          "ascd_pfl": block_cd.BlockRule(0.5, 0.3, True, False, frozen=True, theta1=0.4,
                                         gamma=0.2, nu=0.9),
          "scd_pfl": block_cd.BlockRule(0.5, 0.3, False, False)}[name]
  module = dict(asvrcd_pfl=asvrcd_pfl, ascd_pfl=ascd_pfl, svrcd_pfl=svrcd_pfl,
                scd_pfl=scd_pfl)[name]
  assert module.rule(params) == rule  # the modules build exactly these rules
  rng = np.random.default_rng(3)
  m, d0, dl = 2, objective.global_dim, objective.local_dim
  w_state = {k: tf.constant(rng.normal(size=d0)) for k in rule.keys()}
  b_states = [{k: tf.constant(rng.normal(size=dl)) for k in rule.keys()} for _ in range(m)]
  if rule.variance_reduced:  # G = grad F(v)
    g_w, g_b = _central_gradient(objective, data, w_state["v"].numpy(),
                                 np.stack([s["v"].numpy() for s in b_states]))
    w_state["g"] = tf.constant(g_w)
    for i in range(m):
      b_states[i]["g"] = tf.constant(g_b[i])
  x_w = rule.point(w_state).numpy()
  x_b = np.stack([rule.point(s).numpy() for s in b_states])
  want_w, want_b = _central_gradient(objective, data, x_w, x_b)
  mean_w, mean_b = np.zeros(d0), np.zeros((m, dl))
  for js in itertools.product(range(3), repeat=m):
    examples = [(data.x[i][j:j + 1], data.y[i][j:j + 1]) for i, j in enumerate(js)]
    # w sampled: the devices' directions averaged by the aggregator, then the server.
    direction = np.mean([block_cd.w_direction(rule, objective, w_state, b_states[i],
                                              *examples[i]).numpy() for i in range(m)], 0)
    g_w = block_cd.w_estimate(rule, w_state, tf.constant(direction)).numpy()
    # beta sampled
    g_b = np.stack([block_cd.beta_estimate(rule, objective, w_state, b_states[i],
                                           *examples[i])[1].numpy() for i in range(m)])
    other_w = w_state["g"].numpy() if rule.variance_reduced else 0.0
    other_b = (np.stack([s["g"].numpy() for s in b_states]) if rule.variance_reduced
               else 0.0)
    weight = 1.0 / 3 ** m
    mean_w += weight * (0.3 * g_w + 0.7 * other_w)
    mean_b += weight * (0.3 * other_b + 0.7 * g_b)
  # The estimate is E[g]; for the non-VR rules the unsampled block's g is 0.
  assert mean_w == pytest.approx(want_w, abs=1e-12)
  assert mean_b == pytest.approx(want_b, abs=1e-12)


# --- schedules ---------------------------------------------------------------------

@pytest.mark.parametrize("refreshes", [False, True])
def test_round_schedule_has_the_expected_communication_rate(refreshes):
  """Over 20,000 rounds: local iterations per round K ~ Geometric(q) - 1 (mean
  (1-q)/q, variance (1-q)/q^2 within 5 standard errors), so communications per
  iteration are q = p_w (ASCD) or p_w + rho (1 - p_w) (ASVRCD); the communicating
  iteration steps w in a fraction p_w / q of rounds, refreshes in rho / q."""
  p_w, rho, rounds = 0.15, 0.05, 20_000
  q = p_w + rho * (1 - p_w) if refreshes else p_w

  def draw(r):
    s = sampling.round_schedule(7, r, p_w, rho, refreshes)
    return s["local_steps"], s["step_w"], s["refresh"]

  draw_all = tf.function(lambda: tf.map_fn(
      draw, tf.range(rounds), fn_output_signature=(tf.int32, tf.bool, tf.bool)))
  k, step_w, refresh = (np.array(v) for v in draw_all())
  mean, var = ref.expected_local_iterations(q), ref.geometric_variance(q)
  assert abs(k.mean() - mean) < 5 * math.sqrt(var / rounds)
  assert abs(k.var() - var) < 0.05 * var
  iterations = k.sum() + rounds
  assert abs(rounds / iterations - q) < 5 * math.sqrt(q * (1 - q) / iterations)
  if refreshes:
    for observed, p in ((step_w.mean(), p_w / q), (refresh.mean(), rho / q)):
      assert abs(observed - p) < 5 * math.sqrt(p * (1 - p) / rounds)
  else:
    assert step_w.all() and not refresh.any()
