"""TFF execution context whose C++ worker process never outlives its owner.

TFF's default context starts `worker_binary` lazily, lets it inherit stdout/stderr and
leaves it running after Python exits, which holds a CI pipe open forever. Instead,
`local_execution_context()` starts the worker itself:

* with stdout/stderr sent to a log file (never the caller's pipes);
* with PR_SET_PDEATHSIG = SIGKILL, so the kernel kills it if its parent dies, even
  by SIGKILL;
* and stops it on leaving the `with` block: normal end, exception, SIGINT
  (KeyboardInterrupt) or SIGTERM (turned into `SystemExit(143)` while the context is
  active), with an `atexit` hook as a last resort.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from typing import Iterator, Optional

import grpc
import portpicker
import tensorflow_federated as tff
# TFF 0.87 exposes no public constructor for a context over a worker it did not start;
# these are the same pieces `tff.backends.native.create_sync_local_cpp_execution_context`
# composes.
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation)

_PR_SET_PDEATHSIG = 1
_GRPC_OPTIONS = [("grpc.max_message_length", -1),
                 ("grpc.max_receive_message_length", -1),
                 ("grpc.max_send_message_length", -1)]
_LIVE_WORKERS: set["WorkerProcess"] = set()


def worker_binary_path() -> str:
  """Path of the `worker_binary` shipped inside the tensorflow_federated package."""
  return os.path.join(os.path.dirname(tff.__file__), "data", "worker_binary")


def _die_with_parent() -> None:  # runs in the child between fork and exec
  libc = ctypes.CDLL("libc.so.6", use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class WorkerProcess:
  """One local `worker_binary --port=N`, tied to this process's lifetime."""

  def __init__(self, port: Optional[int] = None, log_path: Optional[str] = None,
               max_concurrent_computation_calls: int = -1):
    self.port = port or portpicker.pick_unused_port()
    self.log_path = log_path or os.path.join(
        tempfile.gettempdir(), f"tff_pflego_worker_{os.getpid()}_{self.port}.log")
    self._log = open(self.log_path, "ab")
    self.process = subprocess.Popen(
        [worker_binary_path(), f"--port={self.port}",
         f"--max_concurrent_computation_calls={max_concurrent_computation_calls}"],
        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent, close_fds=True)
    _LIVE_WORKERS.add(self)

  @property
  def address(self) -> str:
    return f"localhost:{self.port}"

  @property
  def pid(self) -> int:
    return self.process.pid

  def stop(self, timeout: float = 10.0) -> None:
    """Stops the worker (SIGINT, then SIGKILL after `timeout`) and reaps it."""
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGINT)
      try:
        self.process.wait(timeout)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    self._log.close()
    _LIVE_WORKERS.discard(self)


@atexit.register
def _stop_all_workers() -> None:
  for worker in list(_LIVE_WORKERS):
    worker.stop(timeout=2.0)


def _wait_until_ready(stub, address: str, process: Optional[subprocess.Popen],
                      timeout: float) -> None:
  deadline = time.monotonic() + timeout
  while not stub.is_ready:
    if process is not None and process.poll() is not None:
      raise RuntimeError(f"TFF worker at {address} exited with code {process.returncode}")
    if time.monotonic() > deadline:
      raise RuntimeError(f"TFF worker at {address} not ready after {timeout:.0f} s")
    time.sleep(0.05)


def _make_sync_context(address: str, process: Optional[subprocess.Popen],
                       default_num_clients: int, ready_timeout: float):
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  _wait_until_ready(stub, address, process, ready_timeout)

  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients
    executor = tff.framework.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  context = tff.framework.SyncExecutionContext(
      executor_fn=tff.framework.ResourceManagingExecutorFactory(stack_fn),
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
  return context, channel


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
  """While active (main thread only), SIGTERM raises SystemExit(143)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    raise SystemExit(128 + signum)

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def local_execution_context(default_num_clients: int = 0, ready_timeout: float = 60.0,
                            log_path: Optional[str] = None
                            ) -> Iterator[WorkerProcess]:
  """Runs TFF computations on a private local worker for the duration of the block.

  Yields the `WorkerProcess`; the previous default context is restored on exit.
  """
  worker = WorkerProcess(log_path=log_path)
  context_stack = tff.framework.get_context_stack()
  previous = context_stack.current
  channel = None
  try:
    with _sigterm_as_exit():
      context, channel = _make_sync_context(
          worker.address, worker.process, default_num_clients, ready_timeout)
      tff.framework.set_default_context(context)
      logging.info("TFF worker pid %d on %s", worker.pid, worker.address)
      yield worker
  finally:
    tff.framework.set_default_context(previous)
    if channel is not None:
      channel.close()
    worker.stop()


class _NoImplicitWorkerContext(tff.framework.SyncContext):
  """Refuses to run computations: use `local_execution_context` (or your own)."""

  def invoke(self, comp, arg):
    raise RuntimeError(
        "no TFF execution context: run inside tff_pflego.runtime.local_execution_context()"
        " or set one with tff.backends.native.set_sync_local_cpp_execution_context()")


def forbid_implicit_workers() -> None:
  """Replaces TFF's default context, which would start an unmanaged worker_binary."""
  tff.framework.set_default_context(_NoImplicitWorkerContext())
