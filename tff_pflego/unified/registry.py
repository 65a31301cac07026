"""The unified optimizers by name: `build(objective, data, OptimizerConfig)`.

Each name is a module of `tff_pflego.unified`; it loads when the optimizer is built, so
that the names (and the rules below) are known before TensorFlow loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
  from tff_pflego.unified.objectives import DeviceData, Objective
  from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm

OPTIMIZERS = ("lsgd_pfl", "ascd_pfl", "asvrcd_pfl", "scd_pfl", "svrcd_pfl", "l2sgd_plus",
              "pfedme")

# The baselines solve the mixture objective only; the others take any objective.
ONLY_FOR = {"l2sgd_plus": ("mx2",), "pfedme": ("mx2",)}


# Partial participation leaves the devices outside a round's cohort as they are, which
# is the frozen-block rule: methods with a full-gradient reference point (it needs
# every device) or lifted momentum (unsampled blocks move) need every device.
PARTIAL_PARTICIPATION = ("lsgd_pfl", "ascd_pfl", "scd_pfl")


def partial_participation_problem(name: str, frozen: bool) -> Optional[str]:
  """Why `name` cannot run with a cohort of the devices per round, or None."""
  if name not in PARTIAL_PARTICIPATION or (name == "ascd_pfl" and not frozen):
    variant = "" if name != "ascd_pfl" else " --ascd_variant=lifted"
    return (f"--devices_per_round: {name}{variant} needs every device in every round; "
            f"partial participation runs {', '.join(PARTIAL_PARTICIPATION)} (frozen)")
  return None


def supports(name: str, objective_kind: str) -> bool:
  return objective_kind in ONLY_FOR.get(name, (objective_kind,))


def build_optimizer(name: str, objective: Objective, data: DeviceData,
                    config: OptimizerConfig) -> UnifiedAlgorithm:
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown unified optimizer {name!r}; available: {', '.join(OPTIMIZERS)}")
  r = config.devices_per_round
  if r is not None and r < objective.num_devices:
    problem = partial_participation_problem(name, config.frozen)
    if problem:
      raise ValueError(problem)
  return importlib.import_module(f"tff_pflego.unified.{name}").build(objective, data, config)
