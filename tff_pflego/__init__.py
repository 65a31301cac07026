"""tff-pflego: PFLEGO (personalized FL with exact stochastic gradient descent) in TFF.

    import tff_pflego
    process = tff_pflego.build_pflego_process(body_fn, image_shape=..., ...)

See README.md for the full example.
"""

from tff_pflego.algorithms.common import initial_client_state
from tff_pflego.algorithms.pflego import PflegoState, build_pflego_process
from tff_pflego.runtime import local_execution_context

__all__ = ["PflegoState", "build_pflego_process", "initial_client_state",
           "local_execution_context"]
__version__ = "0.1.0"
