"""Entry points: no TFF worker survives them, and user mistakes exit 2 in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import ENV, assert_gone, tiny_run, wait_for_worker


def test_binary_ends_normally_and_leaves_no_worker(prepared, tmp_path):
  """Only the binary's own worker is watched (its descendant): workers of other jobs
  on the machine neither fail nor pass this test."""
  proc = subprocess.Popen(tiny_run(prepared, tmp_path / "out"), env=ENV, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  worker = wait_for_worker(proc)
  stdout, stderr = proc.communicate(timeout=300)
  assert proc.returncode == 0, stderr[-3000:]
  assert "test_accuracy_mean" in stdout
  assert_gone(worker)


def test_importing_the_package_and_exiting_prints_nothing():
  """TFF's default context, torn down at exit, used to print "Exception ignored in
  ServiceManager.__del__ ... 'NoneType' object has no attribute 'Popen'"."""
  script = "import tff_pflego.experiment, tff_pflego.algorithms.registry\nprint('ok')\n"
  result = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0 and result.stdout == "ok\n", result.stderr[-3000:]
  assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                      (signal.SIGKILL, -9)])
def test_binary_killed_mid_run_leaves_no_worker(prepared, tmp_path, sig, code):
  proc = subprocess.Popen(tiny_run(prepared, tmp_path / "out", rounds=10000), env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  worker = wait_for_worker(proc)
  time.sleep(1.0)  # let it get into the rounds
  proc.send_signal(sig)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == code, stderr.decode()[-3000:]
  if sig != signal.SIGKILL:
    assert stderr.decode().strip().endswith(
        f"stopped by {sig.name}; the outputs written so far are kept")
  assert_gone(worker)


def test_exception_inside_the_context_stops_the_worker():
  script = ("from tff_pflego import runtime\n"
            "with runtime.local_execution_context() as w:\n"
            "  print(w.pid, flush=True)\n"
            "  raise RuntimeError('boom')\n")
  result = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 1 and "boom" in result.stderr
  pid = int(result.stdout.split()[0])
  assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_temporary_worker_log_is_removed_only_when_empty(tmp_path):
  from tff_pflego import runtime
  quiet = runtime.WorkerProcess()
  quiet.stop()
  assert not os.path.exists(quiet.log_path)
  noted = runtime.WorkerProcess()
  with open(noted.log_path, "a") as log:
    log.write("what a worker wrote\n")
  noted.stop()
  assert open(noted.log_path).read() == "what a worker wrote\n"
  os.remove(noted.log_path)
  chosen = runtime.WorkerProcess(log_path=str(tmp_path / "worker.log"))
  chosen.stop()
  assert os.path.getsize(chosen.log_path) == 0  # a log the caller named is the caller's


@pytest.fixture
def private_tempdir(tmp_path, monkeypatch):
  """Points `tempfile` at an empty directory of the test's own, so what a test leaves
  there is what the code under test left."""
  import tempfile
  temporary = tmp_path / "tmp"
  temporary.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temporary))
  return temporary


def _left_behind(temporary) -> list:
  """What is in `temporary` but AutoGraph's generated files (it removes those at exit)."""
  return [name for name in os.listdir(temporary)
          if not name.startswith("__autograph_generated_file")]


def test_preparing_data_leaves_nothing_in_the_temporary_directory(tmp_path, private_tempdir):
  """TFDS makes an empty `tmp*tfds` directory each time a builder is constructed for
  data not yet prepared and never removes it (110 were left by one CI run): preparing
  Fashion-MNIST and splitting it into clients, from nothing, leaves the temporary
  directory as it found it."""
  import tempfile
  from tff_pflego.data import load_federated_data
  load_federated_data("fashion_mnist", "high", 5, seed=0, data_dir=str(tmp_path / "data"))
  assert tempfile.gettempdir() == str(private_tempdir)  # restored after each builder
  assert _left_behind(private_tempdir) == []


def test_an_image_folder_builder_leaves_nothing_in_the_temporary_directory(
    tmp_path, private_tempdir):
  """The same for the CIFAR-10 JPEG copy's preparation (`tfds.folder_dataset.ImageFolder`,
  a builder too): building it over a freshly unpacked folder leaves nothing behind."""
  import tempfile
  import zipfile
  import numpy as np
  import tensorflow as tf
  from tff_pflego.data import sources
  png = tf.io.encode_png(np.zeros((4, 4, 3), np.uint8)).numpy()
  with zipfile.ZipFile(tmp_path / "tiny.zip", "w") as z:
    for split in ("train", "test"):
      for label in ("a", "b"):
        z.writestr(f"{split}/{label}/0.png", png)
  preparation = sources.ImageFolderPreparation("tiny.zip", "tiny", (4, 4, 3))
  preparation.build(str(tmp_path / "data"), str(tmp_path), str(tmp_path / "scratch"))
  builder = preparation.builder(str(tmp_path / "data"))
  assert builder.info.splits["train"].num_examples == 2  # the folder was read
  assert tempfile.gettempdir() == str(private_tempdir)
  assert _left_behind(private_tempdir) == []


def test_a_lost_worker_is_reported_with_a_log_that_still_exists(tmp_path):
  """The message names the log only when it outlives the worker: a temporary log
  left empty is removed by `stop`, so it is not cited."""
  from tff_pflego import runtime
  for log_path, writes, cited in [(None, "", False), (None, "fatal: bad op\n", True),
                                  (str(tmp_path / "named.log"), "", True)]:
    worker = runtime.WorkerProcess(log_path=log_path)
    with open(worker.log_path, "a") as log:
      log.write(writes)
    worker.process.kill()
    worker.process.wait()
    problem = runtime._process_health(worker)()
    worker.stop()
    assert f"exited with code {-signal.SIGKILL}" in problem
    if cited:
      assert problem.endswith(f"its log: {worker.log_path}")
      assert os.path.exists(worker.log_path)
      if log_path is None:
        os.remove(worker.log_path)
    else:
      assert problem.endswith("it wrote nothing to its log")
      assert not os.path.exists(worker.log_path)


_DISPOSAL_AFTER_CLOSE = """
import asyncio, gc, sys
import grpc, numpy as np
import tensorflow_federated as tff
from tff_pflego import runtime
if sys.argv[1] == "hook":
  runtime.ignore_disposals_after_close()
worker = runtime.WorkerProcess()
try:
  channel = grpc.insecure_channel(worker.address)
  stub = tff.framework.RemoteExecutorGrpcStub(channel)
  runtime._wait_until_ready(stub, worker.address, worker.process, timeout=60)
  executor = tff.framework.RemoteExecutor(stub, dispose_batch_size=1)
  executor.set_cardinalities({tff.CLIENTS: 1})
  value = asyncio.run(executor.create_value(np.int32(1), tff.TensorType(np.int32)))
  channel.close()
  if sys.argv[2] == "collected":
    del value  # its finalizer disposes of it on the worker: the channel is closed
    gc.collect()
finally:
  worker.stop()
print("end")
"""


@pytest.mark.parametrize("when", ["collected", "at_exit"])
@pytest.mark.parametrize("hook", [False, True])
def test_a_remote_value_disposed_after_the_channel_closed_prints_nothing(hook, when):
  """What a stop signal mid-round left behind: a remote value of the cut-short round,
  disposed of after the context closed its channel, printed a gRPC traceback: as
  "Exception ignored in: <finalize object>" when collected, as a plain traceback when
  still alive at exit (`weakref.finalize`'s exit handler; seen after a parked Omniglot
  run, 2026-11-28). Without the hook the same script prints it (so the scenario is the
  real one); with it, stderr stays clean."""
  result = subprocess.run([sys.executable, "-c", _DISPOSAL_AFTER_CLOSE,
                           "hook" if hook else "plain", when], env=ENV,
                          capture_output=True, text=True, timeout=180)
  assert result.returncode == 0 and result.stdout == "end\n", result.stderr[-3000:]
  printed = "closed channel" in result.stderr and "Traceback" in result.stderr
  assert printed != hook, result.stderr[-3000:]


def test_other_unraisable_errors_still_reach_the_previous_hook(monkeypatch):
  import weakref
  from tff_pflego import runtime
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(str(u.exc_value)))
  uncaught = []
  monkeypatch.setattr(sys, "excepthook", lambda t, value, tb: uncaught.append(str(value)))
  runtime.ignore_disposals_after_close()
  wrappers = sys.unraisablehook, sys.excepthook
  runtime.ignore_disposals_after_close()
  assert (sys.unraisablehook, sys.excepthook) == wrappers  # idempotent: one wrapper each
  try:
    raise ValueError("Cannot invoke RPC on closed channel! (raised here)")
  except ValueError as error:
    sys.excepthook(ValueError, error, error.__traceback__)
  assert uncaught == ["Cannot invoke RPC on closed channel! (raised here)"]

  def fail(message):
    raise ValueError(message)

  class Owner:
    pass

  owner = Owner()
  weakref.finalize(owner, fail, "Cannot invoke RPC on closed channel! (not TFF's)")
  other = Owner()
  weakref.finalize(other, fail, "another error")
  del owner, other
  assert seen == ["Cannot invoke RPC on closed channel! (not TFF's)", "another error"]
