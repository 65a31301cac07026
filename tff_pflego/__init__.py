"""tff-pflego: PFLEGO (personalized federated learning with exact stochastic gradient descent) in TFF.

    import tff_pflego
    process = tff_pflego.build_pflego_process(body_fn, image_shape=..., ...)

See README.md for the full example. The names below load TensorFlow on first use, so
importing a light module of the package (`tff_pflego.cli`) stays fast.
"""

import importlib
from typing import Any

_EXPORTS = {
    "PflegoState": "tff_pflego.algorithms.pflego",
    "build_pflego_process": "tff_pflego.algorithms.pflego",
    "initial_client_state": "tff_pflego.algorithms.common",
    "local_execution_context": "tff_pflego.runtime",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f"module 'tff_pflego' has no attribute {name!r}")
  return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
