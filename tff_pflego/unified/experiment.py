"""One unified-framework run from its settings: problem, constants, optimum, optimizer.

The synthetic problems use the paper's objectives (MX2 with lam = 0.01/sigma, EWS
without a ridge) and the paper's local mu' (smallest eigenvalue of the average
logistic Hessian at the generating parameters, spec section 8); every other constant is
computed from the data (`constants`). F* comes from the central float64 solver.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tff_pflego.errors import UserError
from tff_pflego.unified import constants, driver, registry, solver, synthetic
from tff_pflego.unified.objectives import Objective
from tff_pflego.unified.process import OptimizerConfig

ASCD_VARIANTS = ("frozen", "lifted")


@dataclasses.dataclass(frozen=True)
class UnifiedConfig:
  dataset: str = "synthetic_mx2"
  heterogeneity: float = 0.1  # sigma
  objective: Optional[str] = None  # None: the dataset's (mx2 / ews)
  algorithm: str = "ascd_pfl"
  rounds: int = 1000  # communications
  seed: int = 0  # the optimizer's draws (the data's seed is the paper's 111)
  data_seed: int = 111
  num_devices: int = 20
  num_examples: int = 1000
  reparametrize: bool = True
  p_w: Optional[float] = None  # None: the theory's calL_w / (calL_w + calL_beta)
  ascd_variant: str = "frozen"
  local_steps: int = 5  # LSGD-PFL's tau
  lsgd_lr: Optional[float] = None
  eval_every: int = 1
  output_dir: Optional[str] = None
  progress: bool = False

  def check(self) -> None:
    problems = []
    if self.dataset not in synthetic.SYNTHETIC:
      problems.append(f"--dataset must be one of {', '.join(synthetic.SYNTHETIC)} for "
                      f"the unified framework, got {self.dataset!r}")
    expected = self.dataset.split("_", 1)[-1]
    if self.objective not in (None, expected):
      problems.append(f"--objective for {self.dataset} is {expected}, got "
                      f"{self.objective!r}")
    if self.algorithm not in registry.OPTIMIZERS:
      problems.append(f"--algorithm must be one of {', '.join(registry.OPTIMIZERS)}, "
                      f"got {self.algorithm!r}")
    if not self.heterogeneity > 0:
      problems.append(f"--heterogeneity must be > 0, got {self.heterogeneity}")
    if self.p_w is not None and not 0 < self.p_w < 1:
      problems.append(f"--p_w must be in (0, 1), got {self.p_w}")
    if self.ascd_variant not in ASCD_VARIANTS:
      problems.append(f"--ascd_variant must be one of {', '.join(ASCD_VARIANTS)}, got "
                      f"{self.ascd_variant!r}")
    for name in ("rounds", "local_steps", "eval_every", "num_devices", "num_examples"):
      if getattr(self, name) < 1:
        problems.append(f"--{name} must be >= 1, got {getattr(self, name)}")
    if problems:
      raise UserError(problems[0])


@dataclasses.dataclass(frozen=True)
class Problem:
  objective: Objective
  problem: synthetic.SyntheticProblem
  constants: constants.BlockConstants
  params: constants.StepParameters
  optimum: solver.Optimum


def build_problem(config: UnifiedConfig) -> Problem:
  sigma, m, n = config.heterogeneity, config.num_devices, config.num_examples
  if config.dataset == "synthetic_mx2":
    problem = synthetic.synthetic_mx2(sigma, m, n, seed=config.data_seed)
    objective = Objective("mx2", "logistic", m, problem.data.x.shape[-1],
                          penalty=synthetic.mx2_penalty(sigma),
                          reparametrize=config.reparametrize)
    thetas = problem.local_true
  else:
    problem = synthetic.synthetic_ews(sigma, m, n, seed=config.data_seed)
    d_g = problem.global_true.shape[0]
    objective = Objective("ews", "logistic", m, problem.data.x.shape[-1],
                          global_features=d_g, reparametrize=config.reparametrize)
    thetas = np.concatenate([np.tile(problem.global_true, (m, 1)), problem.local_true], 1)
  mu_prime = constants.logistic_curvature_at(objective, problem.data, thetas)
  block = constants.block_constants(
      objective, constants.curvatures(objective, problem.data, mu_prime))
  params = constants.step_parameters(block, n, p_w=config.p_w)
  optimum = solver.solve(objective, problem.data)
  return Problem(objective, problem, block, params, optimum)


def estimation_error(problem: Problem):
  """MX2: sum_m |beta_m - beta*_m|^2; EWS: |s w - w*|^2 + (1/M) sum_m |beta_m - beta*_m|^2
  (spec 4.1, 4.2)."""
  truth, objective = problem.problem, problem.objective

  def error(w: np.ndarray, betas: np.ndarray) -> float:
    local = float(np.sum((betas - truth.local_true) ** 2))
    if objective.kind == "mx2":
      return local
    return (float(np.sum((objective.scale * w - truth.global_true) ** 2))
            + local / objective.num_devices)
  return error


def run(config: UnifiedConfig) -> dict:
  config.check()
  problem = build_problem(config)
  optimizer_config = OptimizerConfig(
      problem.params, config.seed,
      frozen=config.ascd_variant == "frozen", local_steps=config.local_steps,
      lsgd_lr=config.lsgd_lr)
  algorithm = registry.build_optimizer(config.algorithm, problem.objective,
                                       problem.problem.data, optimizer_config)
  return driver.run(
      algorithm, problem.problem.data, config.rounds, problem.optimum.value,
      output_dir=config.output_dir, eval_every=config.eval_every,
      extras=driver.Extras(estimation_error=estimation_error(problem)),
      progress=config.progress,
      summary_extra=dict(
          settings=dataclasses.asdict(config),
          constants=dataclasses.asdict(problem.constants),
          step_parameters=dataclasses.asdict(problem.params),
          optimum=dict(value=problem.optimum.value,
                       gradient_norm=problem.optimum.gradient_norm,
                       solver_iterations=problem.optimum.iterations)))
