"""Smoothness and strong convexity of F (spec UNIFIED.md sections 1 and 2.3), from data.

Curvature of the device loss f~ (mean loss + (ridge/2)|theta|^2):
  logistic, one example      |x|^2 / 4 + ridge            (sigma(1 - sigma) <= 1/4)
  logistic, n examples       lambda_max(X^T X) / (4 n) + ridge
  softmax + bias, one        |[x; 1]|^2 / 2 + ridge       (diag(p) - p p^T <= 1/2)
  softmax + bias, n          lambda_max(X~^T X~) / (2 n) + ridge
  strong convexity mu'       ridge, or a value measured at a point (`local_curvature`,
                             only valid near that point: logistic losses are not
                             globally strongly convex)
taking the largest over devices (the reference's max|x|/4 is defect B4).

Each form writes f_m(u, beta) = sum_k c_k f~(a_k u + b_k beta) + (lam_c/2)|u - beta|^2,
so with f~ between mu' I and L I the Hessian of f_m in (u, beta) lies between the 2x2
matrices D(mu') and D(L), D(c) = c sum_k c_k [a_k b_k]^T [a_k b_k] + lam_c [[1,-1],[-1,1]]
(EWS: D = diag(L_g, L_l) from the global and local feature columns, D(mu') = mu' I).
With u = s w and F = (1/M) sum_m f_m:
  L_w  = s^2 D(L)_uu,     L_beta = D(L)_bb / M,   (calligraphic: L -> one-example L')
  mu   = min( lambda_min(T D(mu') T), D(mu')_bb / M ),  T = diag(s, 1/sqrt(M)),
the two ways F can curve least: all beta_m moving together with w (T D T), or the
beta_m moving against each other with sum zero (D_bb / M).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from tff_pflego.unified.objectives import DeviceData, Objective


@dataclasses.dataclass(frozen=True)
class Curvatures:
  """Bounds on the device loss f~: full data (L), one example (L'), strong convexity."""
  smooth: float  # L
  smooth_one: float  # L' (calligraphic)
  strong: float  # mu'
  # EWS: the same for the global / local feature columns
  smooth_split: tuple[float, float] = (0.0, 0.0)
  smooth_one_split: tuple[float, float] = (0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class BlockConstants:
  """The block constants of F (spec convention), written to summary.json."""
  L_w: float
  L_beta: float
  mu: float
  calL_w: float
  calL_beta: float
  L_tilde: float  # L of f~
  calL_tilde: float  # L' of f~
  mu_tilde: float  # mu' of f~


@dataclasses.dataclass(frozen=True)
class StepParameters:
  """ASVRCD-PFL's Theorem 9 parameters as the reference implements them (spec 2.3);
  ASCD, SCD, SVRCD and LSGD take theirs from these."""
  p_w: float
  rho: float
  calL: float
  eta: float
  theta1: float
  theta2: float
  gamma: float
  nu: float
  theta_ascd: float  # ASCD's momentum weight min(0.8, 1/eta)


def _with_bias(x: np.ndarray) -> np.ndarray:
  return np.concatenate([x, np.ones(x.shape[:-1] + (1,), x.dtype)], axis=-1)


def _largest_gram_eigenvalue(x: np.ndarray) -> float:
  """max over devices of lambda_max(X_m^T X_m) / n.

  X_m^T X_m (d x d) and X_m X_m^T (n x n) have the same nonzero eigenvalues, so the
  smaller of the two is decomposed (real data: n = 100 examples of up to d = 3073
  features, 100^3 instead of 3073^3 operations per device)."""
  n, d = x.shape[1], x.shape[2]
  gram = (lambda xm: xm @ xm.T) if n < d else (lambda xm: xm.T @ xm)
  return max(float(np.linalg.eigvalsh(gram(xm) / n)[-1]) for xm in x)


def curvatures(objective: Objective, data: DeviceData,
               local_curvature: Optional[float] = None) -> Curvatures:
  """The bounds of the module docstring for `objective`'s loss on `data`."""
  x = np.asarray(data.x, np.float64)
  if objective.loss == "softmax":
    x, factor = _with_bias(x), 0.5
  else:
    factor = 0.25
  ridge = objective.ridge
  strong = ridge + (local_curvature or 0.0)

  def bounds(columns: np.ndarray) -> tuple[float, float]:
    one = factor * float(np.max(np.sum(columns ** 2, axis=-1)))
    return factor * _largest_gram_eigenvalue(columns) + ridge, one + ridge

  smooth, smooth_one = bounds(x)
  if objective.kind != "ews":
    return Curvatures(smooth, smooth_one, strong)
  d_g = objective.global_features
  (g, g_one), (l, l_one) = bounds(x[..., :d_g]), bounds(x[..., d_g:])
  return Curvatures(smooth, smooth_one, strong, (g, l), (g_one, l_one))


def logistic_curvature_at(objective: Objective, data: DeviceData,
                          thetas: np.ndarray) -> float:
  """lambda_min of the device-averaged logistic Hessian (1/M) sum_m X_m^T S_m X_m / n at
  the per-device parameters `thetas` [M, d] (the synthetic problems' generating ones):
  the reference's mu' (spec section 8), with its eigenvalue taken as the smallest."""
  if objective.loss != "logistic":
    raise ValueError("logistic_curvature_at is for the logistic loss")
  x = np.asarray(data.x, np.float64)
  p = 1.0 / (1.0 + np.exp(-np.einsum("mnd,md->mn", x, thetas)))
  hessian = np.einsum("mn,mnd,mne->de", p * (1 - p), x, x) / (x.shape[0] * x.shape[1])
  return float(np.linalg.eigvalsh(hessian)[0])


def _terms(objective: Objective) -> tuple[list[tuple[float, float, float]], float]:
  """[(c_k, a_k, b_k)] and lam_c of the module docstring."""
  lam, kind = objective.penalty, objective.kind
  if kind == "fl":
    return [(1.0, 1.0, 0.0)], 0.0
  if kind == "local":
    return [(1.0, 0.0, 1.0)], 0.0
  if kind == "mt2":
    return [(objective.alpha, 1.0, 0.0), (1.0, 0.0, 1.0)], lam
  if kind == "mx2":
    return [(1.0, 0.0, 1.0)], lam
  if kind == "apfl2":
    a = objective.mixture
    return [(lam, 1.0, 0.0), (1.0, a, 1.0 - a)], 0.0
  raise ValueError(f"{kind} has no term list")


def _device_matrix(objective: Objective, curvature: float,
                   split: Optional[tuple[float, float]] = None) -> np.ndarray:
  if objective.kind == "ews":
    return np.diag(split) if split is not None else curvature * np.eye(2)
  terms, lam_c = _terms(objective)
  matrix = lam_c * np.array([[1.0, -1.0], [-1.0, 1.0]])
  for c, a, b in terms:
    matrix += curvature * c * np.outer([a, b], [a, b])
  return matrix


def block_constants(objective: Objective, curv: Curvatures) -> BlockConstants:
  s2, m = objective.scale ** 2, objective.num_devices
  ews = objective.kind == "ews"
  upper = _device_matrix(objective, curv.smooth, curv.smooth_split if ews else None)
  upper_one = _device_matrix(objective, curv.smooth_one,
                             curv.smooth_one_split if ews else None)
  lower = _device_matrix(objective, curv.strong)
  has_w, has_beta = objective.global_dim > 0, objective.local_dim > 0
  if has_w and has_beta:
    t = np.diag([math.sqrt(s2), 1.0 / math.sqrt(m)])
    mu = min(float(np.linalg.eigvalsh(t @ lower @ t)[0]), lower[1, 1] / m)
  elif has_w:
    mu = s2 * lower[0, 0]
  else:
    mu = lower[1, 1] / m
  return BlockConstants(
      L_w=s2 * upper[0, 0] if has_w else 0.0,
      L_beta=upper[1, 1] / m if has_beta else 0.0, mu=max(mu, 0.0),
      calL_w=s2 * upper_one[0, 0] if has_w else 0.0,
      calL_beta=upper_one[1, 1] / m if has_beta else 0.0,
      L_tilde=curv.smooth, calL_tilde=curv.smooth_one, mu_tilde=curv.strong)


def paper_mu(objective: Objective) -> float:
  """The reference code's heuristic mu for the real-data runs (spec 4.3; the problem
  is over-parametrized, so the true mu without a ridge is 0)."""
  m, lam = objective.num_devices, objective.penalty
  if objective.kind == "mt2":
    return lam / (2 * m)
  if objective.kind == "mx2":
    return 0.01 / (3 * m)
  if objective.kind == "apfl2":
    return 0.01 * (1 - objective.mixture) ** 2 / m
  raise ValueError(f"the paper gives no heuristic mu for {objective.kind}")


def step_parameters(constants: BlockConstants, num_examples: int,
                    p_w: Optional[float] = None, mu: Optional[float] = None
                    ) -> StepParameters:
  """Spec 2.3 (Theorem 9 as implemented in the reference): p_w = calL_w/(calL_w +
  calL_beta) unless given (the p_w ablation recomputes eta for it), rho = p_w / n,
  calL = 2 max(calL_w/p_w, calL_beta/(1-p_w)), eta = 1/(4 calL), theta2 = 1/2,
  theta1 = min(1/2, sqrt(eta mu max(1/2, theta2/rho))), gamma = 1/max(2 mu, 4 theta1/eta),
  nu = 1 - gamma mu; ASCD's theta = min(0.8, 1/eta)."""
  mu = constants.mu if mu is None else mu
  cw, cb = constants.calL_w, constants.calL_beta
  if p_w is None:
    p_w = cw / (cw + cb) if cb > 0 else 1.0
  if not 0 < p_w <= 1 or (p_w == 1 and cb > 0):
    raise ValueError(f"p_w must be in (0, 1) with a local block, got {p_w}")
  cal = 2 * max(cw / p_w, cb / (1 - p_w) if cb > 0 else 0.0)
  eta = 1.0 / (4 * cal)
  rho = p_w / num_examples
  theta2 = 0.5
  if not mu > 0:
    raise ValueError(f"the accelerated parameters need mu > 0, got {mu}")
  theta1 = min(0.5, math.sqrt(eta * mu * max(0.5, theta2 / rho)))
  gamma = 1.0 / max(2 * mu, 4 * theta1 / eta)
  return StepParameters(p_w=p_w, rho=rho, calL=cal, eta=eta, theta1=theta1,
                        theta2=theta2, gamma=gamma, nu=1 - gamma * mu,
                        theta_ascd=min(0.8, 1.0 / eta))
