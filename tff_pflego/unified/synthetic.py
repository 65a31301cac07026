"""The paper's synthetic problems (spec UNIFIED.md 4.1, 4.2): seeded numpy, no files.

Both draw from numpy's legacy generator in the reference code's order (seed, the true
global parameter, seed again, the devices' shifts, then each device's x and y), so a
seed gives the reference's data stream (spec section 8).

  synthetic_mx2  d = 15, w* ~ U(0.49, 0.51)^d, b_m ~ N(0, sigma^2),
                 beta*_m = w* + U(b_m - 0.01, b_m + 0.01)^d,
                 x ~ U(0.2, 0.5)^d, y ~ Bernoulli(sigmoid(x . beta*_m));
                 objective MX2 with lam = 0.01 / sigma.
  synthetic_ews  d_g = 10, d_l = 5, w* ~ N(0, 1)^{d_g},
                 beta*_m ~ U(b_m - 0.01, b_m + 0.01)^{d_l}, b_m ~ N(0, sigma^2),
                 x ~ U(0, 0.1)^{15}, y ~ Bernoulli(sigmoid(x . [w*; beta*_m]));
                 objective EWS, no ridge.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tff_pflego.unified.objectives import DeviceData
from tff_pflego.unified.run_config import SYNTHETIC
PAPER_HETEROGENEITY = {"synthetic_mx2": (0.1, 0.3, 1.0), "synthetic_ews": (5.0, 10.0, 15.0)}


@dataclasses.dataclass(frozen=True)
class SyntheticProblem:
  data: DeviceData
  global_true: np.ndarray  # w* (in the u = w / sqrt(M) scale)
  local_true: np.ndarray  # beta*_m, [M, d_l]


def _labels(rng: np.random.RandomState, x: np.ndarray, theta: np.ndarray) -> np.ndarray:
  probability = 1.0 / (1.0 + np.exp(-(x @ theta)))
  return rng.binomial(1, probability, len(probability))


def synthetic_mx2(sigma: float, num_devices: int = 20, num_examples: int = 1000,
                  dim: int = 15, seed: int = 111) -> SyntheticProblem:
  rng = np.random.RandomState(seed)
  w_true = rng.uniform(0.49, 0.51, size=dim)
  rng = np.random.RandomState(seed)
  shifts = rng.normal(0.0, sigma, size=num_devices)
  betas = np.stack([w_true + rng.uniform(b - 0.01, b + 0.01, size=dim) for b in shifts])
  xs, ys = [], []
  for beta in betas:
    x = rng.uniform(0.2, 0.5, size=(num_examples, dim))
    xs.append(x)
    ys.append(_labels(rng, x, beta))
  return SyntheticProblem(DeviceData(np.stack(xs), np.stack(ys).astype(np.int32)),
                          w_true, betas)


def synthetic_ews(sigma: float, num_devices: int = 20, num_examples: int = 1000,
                  global_dim: int = 10, local_dim: int = 5, seed: int = 111
                  ) -> SyntheticProblem:
  rng = np.random.RandomState(seed)
  w_true = rng.normal(0.0, 1.0, size=global_dim)
  rng = np.random.RandomState(seed)
  shifts = rng.normal(0.0, sigma, size=num_devices)
  betas = np.stack([rng.uniform(b - 0.01, b + 0.01, size=local_dim) for b in shifts])
  xs, ys = [], []
  for beta in betas:
    x = rng.uniform(0.0, 0.1, size=(num_examples, global_dim + local_dim))
    xs.append(x)
    ys.append(_labels(rng, x, np.concatenate([w_true, beta])))
  return SyntheticProblem(DeviceData(np.stack(xs), np.stack(ys).astype(np.int32)),
                          w_true, betas)


def mx2_penalty(sigma: float) -> float:
  """The paper's lam = 0.01 / sigma for synthetic MX2."""
  return 0.01 / sigma
