"""The algorithms by name: the one list of them (flags, README and tests read it here).

Each name is a module of `tff_pflego.algorithms` with `build(config, client_data=None)`
returning an `api.PersonalizedAlgorithm`; the module loads when the algorithm is built,
so that the list is known before TensorFlow loads. To add an algorithm: write its
module and add its name below.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
  from tff_pflego.algorithms.api import (AlgorithmConfig, ClientDataComputations,
                                         PersonalizedAlgorithm)

_NAMES = ("pflego", "fedavg", "fedprox", "fedper", "fedrep", "fedbabu", "ditto",
          "fedrecon", "local_only", "ascd_pfl")


def names() -> tuple[str, ...]:
  return _NAMES


def build_algorithm(name: str, config: AlgorithmConfig,
                    client_data: Optional[ClientDataComputations] = None
                    ) -> PersonalizedAlgorithm:
  """The algorithm `name`; with `client_data` (TFF computations client id -> the
  client's data), its `next` takes client ids and each client reads its data in its
  own computation."""
  if name not in _NAMES:
    raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(_NAMES)}")
  return importlib.import_module(f"tff_pflego.algorithms.{name}").build(config, client_data)


def head_features_cached(name: str, config: AlgorithmConfig) -> bool:
  """Whether `name` under `config` runs head-only steps on features computed once:
  the baselines' `cache_head_features` where a phase trains the head alone (FedPer,
  FedAvg and FedProx have none, so the flag changes nothing there)."""
  module = importlib.import_module(f"tff_pflego.algorithms.{name}")
  plan_fn = getattr(module, "plan", None)
  if plan_fn is None:
    return False
  plan = dataclasses.replace(plan_fn(config), cache_head_features=config.cache_head_features)
  return plan.head_features_cached
