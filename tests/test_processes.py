"""Entry points: no TFF worker survives them, and user mistakes exit 2 in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [sys.executable, os.path.join(REPO, "binaries", "train.py")]
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")


def tiny_run(data_dir, output_dir, rounds=2):
  return TRAIN + ["--dataset=fashion_mnist", "--num_clients=5", "--clients_per_round=2",
                  f"--rounds={rounds}", "--local_steps=2", f"--data_dir={data_dir}",
                  f"--output_dir={output_dir}", "--noprogress"]


def workers_of(pid: int) -> list[psutil.Process]:
  try:
    return [c for c in psutil.Process(pid).children(recursive=True)
            if c.name() == "worker_binary"]
  except psutil.NoSuchProcess:
    return []


def wait_for_worker(proc: subprocess.Popen, timeout: float = 120) -> psutil.Process:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, proc.communicate()
    found = workers_of(proc.pid)
    if found:
      return found[0]
    time.sleep(0.2)
  raise AssertionError("the binary never started a TFF worker")


def assert_gone(worker: psutil.Process, timeout: float = 10) -> None:
  try:
    worker.wait(timeout)
  except psutil.NoSuchProcess:
    pass
  assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


def test_binary_ends_normally_and_leaves_no_worker(prepared, tmp_path):
  before = {p.pid for p in psutil.process_iter() if p.name() == "worker_binary"}
  result = subprocess.run(tiny_run(prepared, tmp_path / "out"), env=ENV,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "test_accuracy_mean" in result.stdout
  after = {p.pid for p in psutil.process_iter()
           if p.name() == "worker_binary" and p.status() != psutil.STATUS_ZOMBIE}
  assert after <= before


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
