"""tff-pflego: PFLEGO (personalized federated learning with exact stochastic gradient descent) in TFF.

    import tff_pflego
    process = tff_pflego.build_pflego_process(body_fn, image_shape=..., ...)

See README.md for the full example. The names below load TensorFlow on first use, so
importing a light module of the package (`tff_pflego.cli`) stays fast.
"""

import atexit
import importlib
import sys
from typing import Any

_EXPORTS = {
    "ServerState": "tff_pflego.algorithms.api",
    "build_pflego_process": "tff_pflego.algorithms.pflego",
    "initial_client_state": "tff_pflego.algorithms.model_types",
    "local_execution_context": "tff_pflego.runtime",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def _release_tff_default_context() -> None:
  """Drops TFF's default context while the interpreter is whole.

  Left to interpreter teardown, its worker manager's `__del__` runs after the modules
  it needs are gone and prints "Exception ignored ... 'NoneType' object has no
  attribute 'Popen'".
  """
  if "tensorflow_federated" in sys.modules:
    importlib.import_module("tff_pflego.runtime").forbid_implicit_workers()


atexit.register(_release_tff_default_context)


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f"module 'tff_pflego' has no attribute {name!r}")
  return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
  return sorted(list(globals()) + __all__)
