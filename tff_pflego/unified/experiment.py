"""One unified-framework run from its settings: problem, constants, optimum, optimizer.

Synthetic problems use the paper's objectives (MX2 with lam = 0.01/sigma, EWS without
a ridge) and the paper's local mu' (smallest eigenvalue of the average logistic
Hessian at the generating parameters, spec section 8). Real data (spec 4.3) use the
softmax-with-bias model, the paper's lam / alpha / a for the objective and c, and a
ridge term (default 0.01) on f~: without it the over-parametrized problem is not
strongly convex, F* may not be attained, and no suboptimality is defined. Every other
constant is computed from the data (`constants`); `paper_mu` replaces mu by the
reference's heuristic in the step parameters (spec 4.3's table). F* comes from the
central float64 solver.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

import numpy as np

from tff_pflego.data import sources
from tff_pflego.errors import UserError
from tff_pflego.unified import (constants, driver, real_data, registry, solver,
                                synthetic)
from tff_pflego.unified.objectives import OBJECTIVES, DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig

ASCD_VARIANTS = ("frozen", "lifted")
DATASETS = synthetic.SYNTHETIC + real_data.REAL
REAL_DATA_RIDGE = 0.01


@dataclasses.dataclass(frozen=True)
class UnifiedConfig:
  dataset: str = "synthetic_mx2"
  heterogeneity: float = 0.1  # sigma (synthetic)
  objective: Optional[str] = None  # synthetic: theirs (mx2 / ews); real data: required
  classes_per_device: int = 2  # c (real data)
  colour: bool = False  # CIFAR-10: 3072 colour features instead of 1024 grey
  ridge: Optional[float] = None  # None: 0 synthetic, REAL_DATA_RIDGE real data
  paper_mu: bool = False  # real data: the reference's heuristic mu in the parameters
  algorithm: str = "ascd_pfl"
  rounds: int = 1000  # communications
  seed: int = 0  # the optimizer's draws
  data_seed: Optional[int] = None  # None: 111 synthetic (the paper's), 0 real data
  num_devices: int = 20
  num_examples: int = 1000  # synthetic n (real data: 100 train / 300 test per device)
  reparametrize: bool = True
  p_w: Optional[float] = None  # None: the theory's calL_w / (calL_w + calL_beta)
  mt_alpha: Optional[float] = None  # MT2's alpha (relaxation); None: the paper's 1
  devices_per_round: Optional[int] = None  # partial participation; None: all M
  ascd_variant: str = "frozen"
  local_steps: int = 5  # LSGD-PFL's tau
  lsgd_lr: Optional[float] = None
  eval_every: int = 1
  output_dir: Optional[str] = None
  overwrite: bool = False  # replace a finished run in output_dir
  progress: bool = False
  data_dir: str = sources.DEFAULT_DATA_DIR
  raw_data_dir: str = sources.DEFAULT_RAW_DATA_DIR

  @property
  def synthetic(self) -> bool:
    return self.dataset in synthetic.SYNTHETIC

  def check(self) -> None:
    """Raises UserError naming the first setting that is not allowed."""
    problem = self._problem()
    if problem:
      raise UserError(problem)

  def _problem(self) -> Optional[str]:
    if self.dataset not in DATASETS:
      return f"--dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}"
    if self.synthetic:
      expected = self.dataset.split("_", 1)[-1]
      if self.objective not in (None, expected):
        return f"--objective for {self.dataset} is {expected}, got {self.objective!r}"
    elif self.objective not in tuple(k for k in OBJECTIVES if k != "ews"):
      return (f"--objective for real data must be one of fl, local, mt2, mx2, apfl2, "
              f"got {self.objective!r}")
    if self.algorithm not in registry.OPTIMIZERS:
      return (f"--algorithm must be one of {', '.join(registry.OPTIMIZERS)}, "
              f"got {self.algorithm!r}")
    if not self.heterogeneity > 0:
      return f"--heterogeneity must be > 0, got {self.heterogeneity}"
    if self.p_w is not None and not 0 < self.p_w < 1:
      return f"--p_w must be in (0, 1), got {self.p_w}"
    if self.mt_alpha is not None and not self.mt_alpha > 0:
      return f"--mt_alpha must be > 0, got {self.mt_alpha}"
    if self.mt_alpha is not None and self.objective != "mt2":
      return f"--mt_alpha applies to --objective=mt2 only, got {self.objective!r}"
    if self.devices_per_round is not None:
      if not 1 <= self.devices_per_round <= self.num_devices:
        return (f"--devices_per_round must be in 1..{self.num_devices}, "
                f"got {self.devices_per_round}")
      if self.devices_per_round < self.num_devices:
        problem = registry.partial_participation_problem(
            self.algorithm, self.ascd_variant == "frozen")
        if problem:
          return problem
    if self.ascd_variant not in ASCD_VARIANTS:
      return (f"--ascd_variant must be one of {', '.join(ASCD_VARIANTS)}, "
              f"got {self.ascd_variant!r}")
    if self.ridge is not None and self.ridge < 0:
      return f"--ridge must be >= 0, got {self.ridge}"
    for name in ("rounds", "local_steps", "eval_every", "num_devices", "num_examples",
                 "classes_per_device"):
      if getattr(self, name) < 1:
        return f"--{name} must be >= 1, got {getattr(self, name)}"
    return None


@dataclasses.dataclass(frozen=True)
class Problem:
  objective: Objective
  data: DeviceData
  constants: constants.BlockConstants
  params: constants.StepParameters
  optimum: solver.Optimum
  extras: driver.Extras
  provenance: dict


def _synthetic(config: UnifiedConfig):
  sigma, m, n = config.heterogeneity, config.num_devices, config.num_examples
  seed = 111 if config.data_seed is None else config.data_seed
  ridge = config.ridge or 0.0
  if config.dataset == "synthetic_mx2":
    problem = synthetic.synthetic_mx2(sigma, m, n, seed=seed)
    objective = Objective("mx2", "logistic", m, problem.data.x.shape[-1],
                          penalty=synthetic.mx2_penalty(sigma), ridge=ridge,
                          reparametrize=config.reparametrize)
    thetas = problem.local_true
  else:
    problem = synthetic.synthetic_ews(sigma, m, n, seed=seed)
    objective = Objective("ews", "logistic", m, problem.data.x.shape[-1],
                          global_features=problem.global_true.shape[0], ridge=ridge,
                          reparametrize=config.reparametrize)
    thetas = np.concatenate([np.tile(problem.global_true, (m, 1)), problem.local_true], 1)
  mu_prime = constants.logistic_curvature_at(objective, problem.data, thetas)
  extras = driver.Extras(estimation_error=_estimation_error(objective, problem))
  provenance = dict(dataset=config.dataset, sigma=sigma, data_seed=seed)
  return objective, problem.data, mu_prime, extras, provenance


def _real(config: UnifiedConfig):
  split = real_data.load(
      config.dataset, config.classes_per_device, config.num_devices,
      seed=0 if config.data_seed is None else config.data_seed, colour=config.colour,
      data_dir=config.data_dir, raw_data_dir=config.raw_data_dir)
  ridge = REAL_DATA_RIDGE if config.ridge is None else config.ridge
  objective = Objective(
      config.objective, "softmax", config.num_devices, split.data.x.shape[-1],
      num_classes=split.num_classes, ridge=ridge, reparametrize=config.reparametrize,
      **(real_data.paper_objective_options(config.objective, config.classes_per_device)
         | ({} if config.mt_alpha is None else dict(alpha=config.mt_alpha))))
  extras = driver.Extras(test_accuracy=real_data.local_accuracy(objective, split.data))
  return objective, split.data, None, extras, split.provenance


def build_problem(config: UnifiedConfig) -> Problem:
  objective, data, mu_prime, extras, provenance = (
      _synthetic(config) if config.synthetic else _real(config))
  block = constants.block_constants(
      objective, constants.curvatures(objective, data, mu_prime))
  mu = constants.paper_mu(objective) if config.paper_mu else None
  params = constants.step_parameters(block, data.num_examples, p_w=config.p_w, mu=mu)
  # The ridge is a global strong convexity: the solver certifies F* with it.
  optimum = solver.solve_once(objective, data,
                              strong_convexity=block.mu if mu_prime is None else 0.0)
  return Problem(objective, data, block, params, optimum, extras, provenance)


def _estimation_error(objective: Objective, truth: synthetic.SyntheticProblem
                      ) -> Callable[[np.ndarray, np.ndarray], float]:
  """MX2: sum_m |beta_m - beta*_m|^2; EWS: |s w - w*|^2 + (1/M) sum_m |beta_m -
  beta*_m|^2 (spec 4.1, 4.2)."""
  def error(w: np.ndarray, betas: np.ndarray) -> float:
    local = float(np.sum((betas - truth.local_true) ** 2))
    if objective.kind == "mx2":
      return local
    return (float(np.sum((objective.scale * w - truth.global_true) ** 2))
            + local / objective.num_devices)
  return error


def check_output_dir(config: UnifiedConfig) -> None:
  """A run already in --output_dir is kept unless --overwrite is given."""
  if config.output_dir is None or config.overwrite:
    return
  if os.path.isfile(config.output_dir):
    raise UserError(f"--output_dir {config.output_dir} is a file, not a directory")
  for name in ("summary.json", "metrics.csv"):
    if os.path.exists(os.path.join(config.output_dir, name)):
      raise UserError(f"--output_dir {config.output_dir} already holds a run ({name}); "
                      "give another directory or --overwrite")


def run(config: UnifiedConfig) -> dict:
  config.check()
  check_output_dir(config)
  problem = build_problem(config)
  optimizer_config = OptimizerConfig(
      problem.params, config.seed, frozen=config.ascd_variant == "frozen",
      local_steps=config.local_steps, lsgd_lr=config.lsgd_lr,
      devices_per_round=config.devices_per_round)
  algorithm = registry.build_optimizer(config.algorithm, problem.objective, problem.data,
                                       optimizer_config)
  try:
    return driver.run(
        algorithm, problem.data, config.rounds, problem.optimum.value,
        output_dir=config.output_dir, eval_every=config.eval_every,
        extras=problem.extras, progress=config.progress,
        summary_extra=dict(
            settings=dataclasses.asdict(config), data=problem.provenance,
            constants=dataclasses.asdict(problem.constants),
            step_parameters=dataclasses.asdict(problem.params),
            optimum=dict(value=problem.optimum.value,
                         gradient_norm=problem.optimum.gradient_norm,
                         certified_gap=problem.optimum.gap_bound,
                         solver_iterations=problem.optimum.iterations)))
  finally:
    algorithm.release()  # its device files: a grid of runs must not pile them up
