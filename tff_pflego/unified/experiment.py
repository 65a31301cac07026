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
from typing import Callable

import numpy as np

from tff_pflego.unified import (constants, driver, real_data, registry, run_config,
                                solver, synthetic)
from tff_pflego.unified.objectives import DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig
from tff_pflego.unified.run_config import UnifiedConfig

REAL_DATA_RIDGE = 0.01


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


def run(config: UnifiedConfig) -> dict:
  config.check()
  run_config.check_output_dir(config)
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
