"""The unified optimizers by name: `build(objective, data, OptimizerConfig)`."""

from __future__ import annotations

from typing import Callable

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


def supports(name: str, objective_kind: str) -> bool:
  return objective_kind in ONLY_FOR.get(name, (objective_kind,))


def build_optimizer(name: str, objective: Objective, data: DeviceData,
                    config: OptimizerConfig) -> UnifiedAlgorithm:
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown unified optimizer {name!r}; available: {', '.join(OPTIMIZERS)}")
  return OPTIMIZERS[name](objective, data, config)
