"""The algorithms by name: the one list of them (flags, README and tests read it here).

To add an algorithm: write its module with `build(config, client_data=None)` returning
an `api.PersonalizedAlgorithm`, and add one line below.
"""

from __future__ import annotations

from typing import Optional

from tff_pflego.algorithms import (ascd_pfl, ditto, fedavg, fedbabu, fedper, fedprox, fedrecon,
                                   fedrep, local_only, pflego)
from tff_pflego.algorithms.api import (AlgorithmConfig, Builder, ClientDataComputations,
                                       PersonalizedAlgorithm)

ALGORITHMS: dict[str, Builder] = {
    "pflego": pflego.build,
    "fedavg": fedavg.build,
    "fedprox": fedprox.build,
    "fedper": fedper.build,
    "fedrep": fedrep.build,
    "fedbabu": fedbabu.build,
    "ditto": ditto.build,
    "fedrecon": fedrecon.build,
    "local_only": local_only.build,
    "ascd_pfl": ascd_pfl.build,
}


def names() -> tuple[str, ...]:
  return tuple(ALGORITHMS)


def build_algorithm(name: str, config: AlgorithmConfig,
                    client_data: Optional[ClientDataComputations] = None
                    ) -> PersonalizedAlgorithm:
  """The algorithm `name`; with `client_data` (TFF computations client id -> the
  client's data), its `next` takes client ids and each client reads its data in its
  own computation."""
  if name not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}")
  return ALGORITHMS[name](config, client_data)
