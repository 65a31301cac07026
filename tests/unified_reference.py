"""Independent float64 numpy implementations for the unified framework's tests.

Written from the spec's formulas (UNIFIED.md 2.1-2.4) with hand-derived logistic
gradients, sharing nothing with `tff_pflego.unified` but its random draws (`sampling`),
so a process and its reference see the same blocks and examples.
"""

from __future__ import annotations

import numpy as np

from tff_pflego.unified import sampling


def sigmoid(t):
  return 1.0 / (1.0 + np.exp(-t))


def device_gradients(kind, scale, lam, alpha, ridge, d_g, w, b, x, y):
  """(grad_w f_m, grad_beta f_m) for the logistic forms, by hand."""
  u = scale * w

  def g_tilde(theta):
    return x.T @ (sigmoid(x @ theta) - y) / len(y) + ridge * theta

  if kind == "fl":
    return scale * g_tilde(u), np.zeros(0)
  if kind == "mx2":
    return scale * lam * (u - b), g_tilde(b) - lam * (u - b)
  if kind == "mt2":
    return scale * (alpha * g_tilde(u) + lam * (u - b)), g_tilde(b) - lam * (u - b)
  if kind == "ews":
    r = (sigmoid(x[:, :d_g] @ u + x[:, d_g:] @ b) - y) / len(y)
    return scale * (x[:, :d_g].T @ r + ridge * u), x[:, d_g:].T @ r + ridge * b
  raise ValueError(kind)


class BlockCD:
  """ASVRCD / SVRCD / ASCD (frozen or lifted) / SCD, one iteration at a time."""

  def __init__(self, problem, params, momentum, variance_reduced, frozen, seed):
    self.p, self.params = problem, params
    self.momentum, self.vr, self.frozen, self.seed = momentum, variance_reduced, frozen, seed
    m, d0, dl = problem["M"], problem["d0"], problem["dl"]
    zeros = lambda *shape: np.zeros(shape)
    self.w = dict(y=zeros(d0), z=zeros(d0), v=zeros(d0), g=zeros(d0))
    self.b = [dict(y=zeros(dl), z=zeros(dl), v=zeros(dl), g=zeros(dl)) for _ in range(m)]
    if self.momentum and self.vr:
      self.t1, self.t2 = params.theta1, params.theta2
    elif self.momentum:
      self.t1, self.t2 = params.theta_ascd, 0.0
    else:
      self.t1, self.t2 = 0.0, 0.0

  def grads(self, w, b, x, y):
    p = self.p
    return device_gradients(p["kind"], p["scale"], p["lam"], p["alpha"], p["ridge"],
                            p["d_g"], w, b, x, y)

  def point(self, s):
    return self.t1 * s["z"] + self.t2 * s["v"] + (1 - self.t1 - self.t2) * s["y"]

  def step(self, s, x, g):
    eta, gamma, nu = self.params.eta, self.params.gamma, self.params.nu
    new = dict(s)
    new["y"] = x - eta * g
    if self.momentum:
      new["z"] = nu * s["z"] + (1 - nu) * x + (gamma / eta) * (new["y"] - x)
    return new

  def other(self, s, x):
    if self.vr:
      return self.step(s, x, s["g"])
    if self.frozen or not self.momentum:
      return s
    return self.step(s, x, np.zeros_like(x))

  def refresh(self, old_w, old_b):
    xs, ys, m = self.p["x"], self.p["y"], self.p["M"]
    full = [self.grads(old_w["y"], old_b[i]["y"], xs[i], ys[i]) for i in range(m)]
    self.w = dict(self.w, v=old_w["y"], g=np.mean([g[0] for g in full], axis=0))
    self.b = [dict(self.b[i], v=old_b[i]["y"], g=full[i][1] / m) for i in range(m)]

  def iteration(self, block, refresh, examples, cohort, q):
    """Devices outside `cohort` keep their beta; the cohort's beta estimates are
    divided by q, the w estimate averages the cohort's parts (partial participation)."""
    xs, ys, m, p_w = self.p["x"], self.p["y"], self.p["M"], self.params.p_w
    old_w, old_b = self.w, self.b
    x_w = self.point(old_w)
    x_b = [self.point(s) for s in old_b]
    if block == "w":
      parts = []
      for i in cohort:
        j = examples[i]
        g = self.grads(x_w, x_b[i], xs[i][j:j + 1], ys[i][j:j + 1])[0]
        if self.vr:
          g = g - self.grads(old_w["v"], old_b[i]["v"], xs[i][j:j + 1], ys[i][j:j + 1])[0]
        parts.append(g)
      g_w = np.mean(parts, axis=0) / p_w + (old_w["g"] if self.vr else 0)
      self.w = self.step(old_w, x_w, g_w)
      self.b = [self.other(old_b[i], x_b[i]) if i in cohort else old_b[i]
                for i in range(m)]
    else:
      new_b = list(old_b)
      for i in cohort:
        j = examples[i]
        g = self.grads(x_w, x_b[i], xs[i][j:j + 1], ys[i][j:j + 1])[1] / m
        if self.vr:
          g_v = self.grads(old_w["v"], old_b[i]["v"], xs[i][j:j + 1], ys[i][j:j + 1])[1]
          g = g - g_v / m
        g = g / ((1 - p_w) * q) + (old_b[i]["g"] if self.vr else 0)
        new_b[i] = self.step(old_b[i], x_b[i], g)
      self.b = new_b
      self.w = self.other(old_w, x_w)
    if refresh:
      self.refresh(old_w, old_b)

  def run_round(self, round_num, cohort=None):
    n, m = self.p["n"], self.p["M"]
    cohort = list(range(m)) if cohort is None else list(cohort)
    q = len(cohort) / m
    sched = sampling.round_schedule(self.seed, round_num, self.params.p_w,
                                    self.params.rho, self.vr)
    if self.vr and round_num == 0:
      self.refresh(self.w, self.b)
      return
    local = int(sched["local_steps"])
    index = [sampling.example_indices(self.seed, round_num, i, local + 1, n).numpy()
             for i in range(m)]
    for k in range(local):
      self.iteration("b", False, [index[i][k] for i in range(m)], cohort, q)
    self.iteration("w" if bool(sched["step_w"]) else "b", bool(sched["refresh"]),
                   [index[i][local] for i in range(m)], cohort, q)


def fedavg(xs, ys, eta, local_steps, rounds, seed):
  """FedAvg, full participation, server rate 1: each client takes `local_steps` SGD
  steps w <- w - eta grad l_j(w) on the logistic loss; the server averages."""
  m, n, d = xs.shape
  w = np.zeros(d)
  history = []
  for r in range(rounds):
    models = []
    for i in range(m):
      index = sampling.example_indices(seed, r, i, local_steps, n).numpy()
      wi = w.copy()
      for j in index:
        wi = wi - eta * xs[i][j] * (sigmoid(xs[i][j] @ wi) - ys[i][j])
      models.append(wi)
    w = np.mean(models, axis=0)
    history.append(w)
  return history


def expected_local_iterations(q: float) -> float:
  return (1 - q) / q if q < 1 else 0.0


def geometric_variance(q: float) -> float:
  return (1 - q) / q ** 2


def logistic_gradient(theta, x, y, ridge):
  return x.T @ (sigmoid(x @ theta) - y) / len(y) + ridge * theta


def l2sgd_plus(xs, ys, lam, ridge, p, eta, scale, rounds, seed):
  """L2SGD+ on (9), written per iteration: returns (xbar / scale, x_m) after `rounds`
  communications (the last averaging step pending, as the process reports it)."""
  m, n, d = xs.shape
  x = np.zeros((m, d))
  table, psi = np.zeros((m, n, d)), np.zeros((m, d))
  x_bar = np.zeros(d)
  for r in range(rounds):
    if r > 0:
      for i in range(m):
        g = lam / (m * p) * (x[i] - x_bar) - (1 / p - 1) * psi[i] / m + table[i].mean(0) / m
        x[i] = x[i] - eta * g
        psi[i] = lam * (x[i] - x_bar)
    local = int(sampling.round_schedule(seed, r, p, 0.0, False)["local_steps"])
    for i in range(m):
      for j in sampling.example_indices(seed, r, i, local, n).numpy():
        grad = logistic_gradient(x[i], xs[i][j:j + 1], ys[i][j:j + 1], ridge)
        g = (grad - table[i][j]) / (m * (1 - p)) + table[i].mean(0) / m + psi[i] / m
        table[i][j] = grad
        x[i] = x[i] - eta * g
    x_bar = x.mean(0)
  return x_bar / scale, x


def pfedme(xs, ys, lam, ridge, scale, rounds, seed, local_rounds=20, inner_steps=5,
           inner_lr=1.0, batch=20, eta=0.005):
  m, n, d = xs.shape
  w, theta = np.zeros(d), np.zeros((m, d))
  for r in range(rounds):
    models = []
    for i in range(m):
      draws = sampling.example_indices(seed, r, i, local_rounds * batch, n).numpy()
      w_m = w.copy()
      for k in range(local_rounds):
        chosen = list(dict.fromkeys(draws[k * batch:(k + 1) * batch]))
        x, y = xs[i][chosen], ys[i][chosen]
        for _ in range(inner_steps):
          theta[i] = theta[i] - inner_lr * (logistic_gradient(theta[i], x, y, ridge)
                                            + lam * (theta[i] - w_m))
        w_m = w_m - eta * lam * (w_m - theta[i])
      models.append(w_m)
    w = np.mean(models, axis=0)
  return w / scale, theta


def lsgd(problem, eta, local_steps, rounds, seed, cohorts):
  """LSGD-PFL with the given cohort per round: the cohort's devices take tau steps on
  one example at a time from the server's w, w becomes their mean, the others wait."""
  m, n = problem["M"], problem["n"]
  w, betas = np.zeros(problem["d0"]), [np.zeros(problem["dl"]) for _ in range(m)]
  p = problem
  for r in range(rounds):
    local_ws = []
    for i in cohorts[r]:
      index = sampling.example_indices(seed, r, i, local_steps, n).numpy()
      w_i, b_i = w.copy(), betas[i]
      for j in index:
        g_w, g_b = device_gradients(p["kind"], p["scale"], p["lam"], p["alpha"],
                                    p["ridge"], p["d_g"], w_i, b_i, p["x"][i][j:j + 1],
                                    p["y"][i][j:j + 1])
        w_i, b_i = w_i - eta / m * g_w, b_i - eta / m * g_b
      local_ws.append(w_i)
      betas[i] = b_i
    w = np.mean(local_ws, axis=0)
  return w, np.stack(betas)
