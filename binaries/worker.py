r"""Starts one TFF C++ worker (`worker_binary`) for `train.py --workers=...`.

  python binaries/worker.py --port=8000        # on each worker machine

then, on the driver machine (the prepared data must lie at the same path everywhere):

  python binaries/train.py --workers=host1:8000,host2:8000 ...

The worker runs until this process gets SIGINT or SIGTERM (or dies: the kernel then
kills the worker too). Its log goes to --log_path.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import signal
import socket
import sys

from absl import flags

from tff_pflego.errors import UserError

_PORT = flags.DEFINE_integer("port", 8000, "TCP port the worker listens on.")
_LOG_PATH = flags.DEFINE_string("log_path", None, "Worker log (default: a temp file).")
_MAX_CALLS = flags.DEFINE_integer(
    "max_concurrent_computation_calls", -1, "Concurrent computation calls (-1: no limit).")


def _check_port_free(port: int) -> None:
  if not 0 < port < 65536:
    raise UserError(f"--port must be in 1..65535, got {port}")
  with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
    try:
      s.bind(("", port))
    except OSError as e:
      raise UserError(f"--port {port} is not free: {e.strerror}") from e


def main(argv: list[str]) -> None:
  from tff_pflego import runtime
  _check_port_free(_PORT.value)
  worker = runtime.WorkerProcess(port=_PORT.value, log_path=_LOG_PATH.value,
                                 max_concurrent_computation_calls=_MAX_CALLS.value)
  print(f"TFF worker pid {worker.pid} listening on port {worker.port}; "
        f"log: {worker.log_path}", flush=True)
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  try:
    code = worker.process.wait()
    raise SystemExit(f"error: the TFF worker exited with code {code}; "
                     f"{worker.log_reference()}")
  finally:
    worker.stop()


if __name__ == "__main__":
  cli.run_main(main)
