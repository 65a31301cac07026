"""The unified optimizers by name: `build(objective, data, OptimizerConfig)`."""

from __future__ import annotations

from typing import Callable, Optional

from tff_pflego.unified import (ascd_pfl, asvrcd_pfl, l2sgd_plus, lsgd_pfl, pfedme,
                                scd_pfl, svrcd_pfl)
from tff_pflego.unified.objectives import DeviceData, Objective
from tff_pflego.unified.process import OptimizerConfig, UnifiedAlgorithm

OPTIMIZERS: dict[str, Callable[[Objective, DeviceData, OptimizerConfig],
                                UnifiedAlgorithm]] = {
    "lsgd_pfl": lsgd_pfl.build,
    "ascd_pfl": ascd_pfl.build,
    "asvrcd_pfl": asvrcd_pfl.build,
    "scd_pfl": scd_pfl.build,
    "svrcd_pfl": svrcd_pfl.build,
    "l2sgd_plus": l2sgd_plus.build,
    "pfedme": pfedme.build,
}

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
  return OPTIMIZERS[name](objective, data, config)
