"""TFF execution context whose C++ worker process never outlives its owner.

TFF's default context starts `worker_binary` lazily, lets it inherit stdout/stderr and
leaves it running after Python exits, which holds a CI pipe open forever. Instead,
`local_execution_context()` starts the worker itself:

* with stdout/stderr sent to a log file (never the caller's pipes);
* with PR_SET_PDEATHSIG = SIGKILL, so the kernel kills it if its parent dies, even
  by SIGKILL;
* and stops it on leaving the `with` block: normal end, exception, SIGINT
  (KeyboardInterrupt) or SIGTERM (turned into `SystemExit(143)` while the context is
  active; the signal is also recorded, so a loop calling `raise_if_stopped` stops even
  when the handler's exception was swallowed), with an `atexit` hook as a last resort.

Leaving a context closes its gRPC channels. TFF's remote values dispose of their
worker-side copies from `weakref` finalizers, in batches; one that runs after the close
(a value of a round a stop signal cut short) would print a gRPC traceback: after
"Exception ignored in: <finalize object>" when collected later, bare when still alive
at exit. The contexts install
`ignore_disposals_after_close`, which drops exactly that error: the worker it addressed
is stopped or unreachable, so there is nothing left to dispose of.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Iterator, Optional, Sequence

import grpc
import portpicker
import tensorflow_federated as tff
# TFF 0.87 exposes no public constructor for a context over a worker it did not start;
# these are the same pieces `tff.backends.native.create_sync_local_cpp_execution_context`
# composes.
from tensorflow_federated.python.core.environments.tensorflow_frontend import (
    tensorflow_computation)

from tff_pflego.errors import UserError, WorkerLostError
from tff_pflego.worker_address import parse_address

_PR_SET_PDEATHSIG = 1
_GRPC_OPTIONS = [("grpc.max_message_length", -1),
                 ("grpc.max_receive_message_length", -1),
                 ("grpc.max_send_message_length", -1)]
_LIVE_WORKERS: set["WorkerProcess"] = set()


_CLOSED_CHANNEL = "Cannot invoke RPC on closed channel"
_IGNORES_DISPOSALS = "ignores_disposals_after_close"  # marks a hook already filtering


def _is_disposal_after_close(exc_value, exc_traceback) -> bool:
  """Whether an exception is a TFF remote value's disposal on a closed channel."""
  if not (isinstance(exc_value, ValueError) and _CLOSED_CHANNEL in str(exc_value)):
    return False
  frames = traceback.extract_tb(exc_traceback)
  return any(frame.name == "_dispose" and frame.filename.endswith(
      os.path.join("executors", "remote_executor.py")) for frame in frames)


def ignore_disposals_after_close() -> None:
  """Drops TFF's remote-value disposals that fail on a closed channel (module docstring):
  a value collected later reports it to `sys.unraisablehook`, one still alive at exit
  (finalized by `weakref.finalize`'s exit handler) to `sys.excepthook`. Every other
  exception still goes to the hook installed before. Idempotent."""
  if not getattr(sys.unraisablehook, _IGNORES_DISPOSALS, False):
    sys.unraisablehook = _skipping_disposals(
        sys.unraisablehook, lambda unraisable: (unraisable.exc_value, unraisable.exc_traceback))
  if not getattr(sys.excepthook, _IGNORES_DISPOSALS, False):
    sys.excepthook = _skipping_disposals(
        sys.excepthook, lambda exc_type, exc_value, exc_traceback: (exc_value, exc_traceback))


def _skipping_disposals(previous_hook, exception_of):
  """`previous_hook` behind a filter: calls whose (exception, traceback), as
  `exception_of` reads them from the hook's arguments, are a disposal after close
  are dropped; every other call goes through unchanged."""
  def hook(*arguments) -> None:
    if not _is_disposal_after_close(*exception_of(*arguments)):
      previous_hook(*arguments)

  setattr(hook, _IGNORES_DISPOSALS, True)
  return hook


def worker_binary_path() -> str:
  """Path of the `worker_binary` shipped inside the tensorflow_federated package."""
  return os.path.join(os.path.dirname(tff.__file__), "data", "worker_binary")


def _die_with_parent() -> None:  # runs in the child between fork and exec
  libc = ctypes.CDLL("libc.so.6", use_errno=True)
  libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# The worker's many TensorFlow threads each draw a glibc malloc arena (up to 8 per
# core), and memory freed in one arena is not reused by threads of another: measured
# over 350 PFLEGO rounds (Fashion-MNIST, r = 20), the worker grew 245 -> 335 MB from
# round 50 with the default and 207 -> 217 MB with two arenas (docs/round_profile.md).
WORKER_MALLOC_ARENAS = "2"
# The worker runs a round's client computations concurrently, which already keeps
# every core busy; each op splitting itself over the cores as well (TensorFlow's
# default intra-op pool) only adds hand-offs between threads. Measured side by side,
# 2 cores, Fashion-MNIST High, 20 clients, tau = 50, identical bodies: PFLEGO's round
# 0.138 -> 0.114 s, FedAvg's 1.08 -> 0.94 s (docs/round_profile.md, "Third pass"). With
# thousands of examples a client, PFLEGO's reductions follow the thread count in their
# last bits (docs/same_numbers.md). A worker running one computation at a time keeps
# TensorFlow's default.
WORKER_INTRA_OP_THREADS = "1"


def worker_environment(max_concurrent_computation_calls: int = -1) -> dict[str, str]:
  """The environment of a worker this process starts: ours, with MALLOC_ARENA_MAX
  and (unless the worker runs one computation at a time) TF_NUM_INTRAOP_THREADS set,
  each unless the user set it."""
  env = dict(os.environ)
  env.setdefault("MALLOC_ARENA_MAX", WORKER_MALLOC_ARENAS)
  if max_concurrent_computation_calls != 1:
    env.setdefault("TF_NUM_INTRAOP_THREADS", WORKER_INTRA_OP_THREADS)
  return env


class WorkerProcess:
  """One local `worker_binary --port=N`, tied to this process's lifetime."""

  def __init__(self, port: Optional[int] = None, log_path: Optional[str] = None,
               max_concurrent_computation_calls: int = -1):
    self.port = port or portpicker.pick_unused_port()
    self._log_is_temporary = log_path is None
    self.log_path = log_path or os.path.join(
        tempfile.gettempdir(), f"tff_pflego_worker_{os.getpid()}_{self.port}.log")
    self._log = open(self.log_path, "ab")
    self.process = subprocess.Popen(
        [worker_binary_path(), f"--port={self.port}",
         f"--max_concurrent_computation_calls={max_concurrent_computation_calls}"],
        stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent, close_fds=True,
        env=worker_environment(max_concurrent_computation_calls))
    _LIVE_WORKERS.add(self)

  @property
  def address(self) -> str:
    return f"localhost:{self.port}"

  @property
  def pid(self) -> int:
    return self.process.pid

  def stop(self, timeout: float = 10.0) -> None:
    """Stops the worker (SIGINT, then SIGKILL after `timeout`) and reaps it; a
    temporary log it left empty is removed (one with anything in it is kept)."""
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGINT)
      try:
        self.process.wait(timeout)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    self._log.close()
    _LIVE_WORKERS.discard(self)
    if self._log_is_temporary and self._log_is_empty():
      with contextlib.suppress(OSError):
        os.remove(self.log_path)

  def _log_is_empty(self) -> bool:
    try:
      return os.path.getsize(self.log_path) == 0
    except OSError:
      return True

  def log_reference(self) -> str:
    """Where to read what the worker wrote, for an error message: the log's path,
    unless it is a temporary log left empty, which `stop` removes."""
    if self._log_is_temporary and self._log_is_empty():
      return "it wrote nothing to its log"
    return f"its log: {self.log_path}"


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


def _connect(address: str, process: Optional[subprocess.Popen], default_num_clients: int,
             ready_timeout: float):
  """A gRPC channel to a ready worker and the executor factory over it."""
  channel = grpc.insecure_channel(address, _GRPC_OPTIONS)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  try:
    _wait_until_ready(stub, address, process, ready_timeout)
  except RuntimeError:
    channel.close()
    raise

  def stack_fn(cardinalities):
    if cardinalities.get(tff.CLIENTS) is None:
      cardinalities[tff.CLIENTS] = default_num_clients
    executor = tff.framework.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  return channel, tff.framework.ResourceManagingExecutorFactory(stack_fn)


_CONTEXT_ARGS = dict(compiler_fn=tff.backends.native.desugar_and_transform_to_native,
                     transform_args=tensorflow_computation.transform_args,
                     transform_result=tensorflow_computation.transform_result)


class _WatchedContext(tff.framework.SyncContext):
  """Runs computations on a helper thread and fails fast when a worker is lost.

  TFF retries UNAVAILABLE gRPC calls forever, so a dead worker would hang the caller.
  Here the caller polls the workers' health while it waits and raises
  `WorkerLostError` naming the worker. The main thread also wakes every `poll_s`, so
  stop signals are handled promptly.
  """

  def __init__(self, inner: tff.framework.SyncContext,
               health_checks: Sequence[Callable[[], Optional[str]]], poll_s: float = 0.5):
    self._inner = inner
    self._health_checks = list(health_checks)
    self._poll_s = poll_s

  def invoke(self, comp, arg):
    future = concurrent.futures.Future()

    def run() -> None:
      try:
        future.set_result(self._inner.invoke(comp, arg))
      except BaseException as e:  # pylint: disable=broad-except
        future.set_exception(e)

    # A daemon thread: a call stuck on a lost worker must not block interpreter exit.
    threading.Thread(target=run, name="tff_invoke", daemon=True).start()
    while True:
      try:
        return future.result(timeout=self._poll_s)
      except concurrent.futures.TimeoutError:
        pass
      for check in self._health_checks:
        problem = check()
        if problem is not None:
          raise WorkerLostError(problem)


def _process_health(worker: "WorkerProcess") -> Callable[[], Optional[str]]:
  def check() -> Optional[str]:
    code = worker.process.poll()
    if code is None:
      return None
    return (f"the TFF worker (pid {worker.pid}, {worker.address}) exited with code "
            f"{code} during a computation; {worker.log_reference()}")
  return check


def _address_health(address: str, failures_allowed: int = 2) -> Callable[[], Optional[str]]:
  host, port = parse_address(address)
  failures = 0

  def check() -> Optional[str]:
    nonlocal failures
    try:
      socket.create_connection((host, port), timeout=2.0).close()
      failures = 0
      return None
    except OSError as e:
      failures += 1
      if failures <= failures_allowed:
        return None
      return f"the TFF worker at {address} is unreachable ({e.strerror or e})"
  return check


_STOP_SIGNAL: Optional[int] = None  # the SIGINT/SIGTERM received while a context ran


def stop_signal() -> Optional[int]:
  """The SIGINT or SIGTERM that stopped the run, or None."""
  return _STOP_SIGNAL


def raise_if_stopped() -> None:
  """Raises again if a stop signal arrived but its exception was swallowed.

  A handler's exception is raised wherever the main thread happens to be; if that is a
  `__del__` or a library's broad `except`, Python drops it. Loops call this between
  steps so a stop request is never lost.
  """
  if _STOP_SIGNAL is not None:
    _raise_for(_STOP_SIGNAL)


def _raise_for(signum: int) -> None:
  if signum == signal.SIGINT:
    raise KeyboardInterrupt
  raise SystemExit(128 + signum)


@contextlib.contextmanager
def stop_signals_as_exceptions() -> Iterator[None]:
  """While active (main thread only): SIGTERM raises SystemExit(143), SIGINT
  KeyboardInterrupt, and the signal is recorded for `stop_signal`/`raise_if_stopped`."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def handler(signum, frame):
    global _STOP_SIGNAL
    _STOP_SIGNAL = signum
    if frame is not None and (frame.f_code.co_name == "__del__" or frame.f_code in {
        getattr(cb, "__code__", None) for cb in gc.callbacks}):
      return  # Python would print and drop it; `raise_if_stopped` raises it instead
    _raise_for(signum)

  previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


@contextlib.contextmanager
def local_execution_context(default_num_clients: int = 0, ready_timeout: float = 60.0,
                            log_path: Optional[str] = None,
                            max_concurrent_computation_calls: int = -1
                            ) -> Iterator[WorkerProcess]:
  """Runs TFF computations on a private local worker for the duration of the block.

  Yields the `WorkerProcess`; the previous default context is restored on exit.
  `max_concurrent_computation_calls=1` runs one TensorFlow computation (one client's
  work) at a time: slower rounds, but per-client timings free of the other clients.
  """
  ignore_disposals_after_close()
  worker = WorkerProcess(log_path=log_path,
                         max_concurrent_computation_calls=max_concurrent_computation_calls)
  previous = tff.framework.get_context_stack().current
  channel = None
  try:
    with stop_signals_as_exceptions():
      channel, factory = _connect(worker.address, worker.process, default_num_clients,
                                  ready_timeout)
      context = _WatchedContext(
          tff.framework.SyncExecutionContext(executor_fn=factory, **_CONTEXT_ARGS),
          [_process_health(worker)])
      tff.framework.set_default_context(context)
      logging.info("TFF worker pid %d on %s", worker.pid, worker.address)
      yield worker
  finally:
    tff.framework.set_default_context(previous)
    if channel is not None:
      channel.close()
    worker.stop()


@contextlib.contextmanager
def remote_execution_context(addresses: Sequence[str], ready_timeout: float = 30.0
                             ) -> Iterator[None]:
  """Runs TFF computations across running TFF workers (`binaries/worker.py`).

  A `MergeableCompExecutionContext` splits each computation's clients between the
  workers (one sub-round per worker), runs the parts up to aggregation there and
  merges the partial aggregates. CLIENTS-placed results come back in another order
  than the clients went in: match them by `client_index`. Client data are resolved by
  each worker from the client ids, so the prepared data must lie at the same path on
  every worker's machine. A worker lost mid-round raises `WorkerLostError`.
  """
  if not addresses:
    raise ValueError("remote_execution_context needs at least one worker address")
  for address in addresses:
    parse_address(address)
  ignore_disposals_after_close()
  previous = tff.framework.get_context_stack().current
  channels = []
  try:
    with stop_signals_as_exceptions():
      async_contexts = []
      for address in addresses:
        try:
          socket.create_connection(parse_address(address), timeout=10.0).close()
          channel, factory = _connect(address, None, 0, ready_timeout)
        except (OSError, RuntimeError) as e:
          raise UserError(f"--workers: no TFF worker answers at {address} "
                          f"(start one with `python binaries/worker.py --port=PORT`): "
                          f"{e}") from e
        channels.append(channel)
        async_contexts.append(
            tff.framework.AsyncExecutionContext(executor_fn=factory, **_CONTEXT_ARGS))
      mergeable = tff.framework.MergeableCompExecutionContext(
          async_contexts, compiler_fn=tff.backends.native.compile_to_mergeable_comp_form,
          transform_args=tensorflow_computation.transform_args,
          transform_result=tensorflow_computation.transform_result)
      context = _WatchedContext(mergeable, [_address_health(a) for a in addresses])
      tff.framework.set_default_context(context)
      logging.info("TFF workers: %s", ", ".join(addresses))
      yield
  finally:
    tff.framework.set_default_context(previous)
    for channel in channels:
      channel.close()


def execution_context(workers: Sequence[str] = (), log_path: Optional[str] = None):
  """`remote_execution_context(workers)` if workers are given, else a private local one."""
  if workers:
    return remote_execution_context(workers)
  return local_execution_context(log_path=log_path)


class _NoImplicitWorkerContext(tff.framework.SyncContext):
  """Refuses to run computations: use `local_execution_context` (or your own)."""

  def invoke(self, comp, arg):
    raise RuntimeError(
        "no TFF execution context: run inside tff_pflego.runtime.local_execution_context()"
        " or set one with tff.backends.native.set_sync_local_cpp_execution_context()")


def forbid_implicit_workers() -> None:
  """Replaces TFF's default context, which would start an unmanaged worker_binary."""
  tff.framework.set_default_context(_NoImplicitWorkerContext())
