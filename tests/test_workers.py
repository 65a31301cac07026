"""Several TFF workers: same results as one process; a lost worker fails fast, resumably."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import psutil
import pytest

from tests.helpers import ENV, REPO, tiny_run

WORKER = [sys.executable, os.path.join(REPO, "binaries", "worker.py")]


class Workers:
  """`binaries/worker.py` processes on localhost."""

  def __init__(self, count: int):
    self.ports = [portpicker.pick_unused_port() for _ in range(count)]
    self.procs = [subprocess.Popen(WORKER + [f"--port={p}"], env=ENV,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for p in self.ports]
    try:
      for proc in self.procs:
        line = proc.stdout.readline()
        assert "listening on port" in line, proc.stderr.read()
    except BaseException:
      self.stop()
      raise

  @property
  def flag(self) -> str:
    return "--workers=" + ",".join(f"localhost:{p}" for p in self.ports)

  def binaries(self, index: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(self.procs[index].pid).children()
            if c.name() == "worker_binary"]

  def stop(self) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    for proc in self.procs:
      proc.wait(30)


@pytest.fixture
def two_workers():
  workers = Workers(2)
  try:
    yield workers
    children = [c for i in range(2) if workers.procs[i].poll() is None
                for c in workers.binaries(i)]
  finally:  # whatever the test or the line above raised: no worker outlives the test
    workers.stop()
  psutil.wait_procs(children, timeout=10)
  assert not [c for c in children if c.is_running() and c.status() != "zombie"]


def _summary(path) -> dict:
  return json.loads((path / "summary.json").read_text())


def test_two_workers_give_the_single_process_results(prepared, two_workers, tmp_path):
  args = lambda out: tiny_run(prepared, out, rounds=3) + ["--clients_per_round=4"]
  single = subprocess.run(args(tmp_path / "single"), env=ENV, capture_output=True,
                          text=True, timeout=600)
  assert single.returncode == 0, single.stderr[-3000:]
  multi = subprocess.run(args(tmp_path / "multi") + [two_workers.flag], env=ENV,
                         capture_output=True, text=True, timeout=600)
  assert multi.returncode == 0, multi.stderr[-3000:]
  a, b = _summary(tmp_path / "single"), _summary(tmp_path / "multi")
  assert b["hyperparameters"]["workers"] == [f"localhost:{p}" for p in two_workers.ports]
  for key, value in a["final"].items():
    # Partial aggregates merged across workers: the same sums in another float order.
    np.testing.assert_allclose(b["final"][key], value, atol=2e-4, err_msg=key)
  assert b["reports"] == a["reports"] == 12


def test_a_worker_lost_mid_run_gives_an_error_and_a_resumable_checkpoint(
    prepared, two_workers, tmp_path):
  out = tmp_path / "out"
  run = tiny_run(prepared, out, rounds=1000) + ["--checkpoint_every=0",
                                                "--eval_every=1000"]
  proc = subprocess.Popen(run + [two_workers.flag], env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while not (out / "rounds.csv").exists() or len(
      (out / "rounds.csv").read_text().splitlines()) < 4:  # header + 3 rounds
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.1)
  for worker in two_workers.binaries(1):
    worker.kill()
  _, stderr = proc.communicate(timeout=90)  # fails fast, does not hang
  assert proc.returncode == 1, stderr[-3000:]
  last = stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and f"localhost:{two_workers.ports[1]}" in last, last
  lost = two_workers.procs[1]  # `binaries/worker.py` ends too, citing a log that exists
  lost.wait(30)
  said = lost.stderr.read().strip().splitlines()[-1]
  assert said.startswith(f"error: the TFF worker exited with code {-signal.SIGKILL}; ")
  if "its log: " in said:
    assert os.path.exists(said.split("its log: ")[1]), said
  else:
    assert said.endswith("it wrote nothing to its log"), said
  checkpoints = sorted(os.listdir(out / "checkpoints"))
  assert len(checkpoints) == 1
  saved = int(checkpoints[0].split("_")[1])
  assert saved >= 3
  # Resumable: the same run continues on a local worker from the saved round.
  resumed = subprocess.run(tiny_run(prepared, out, rounds=saved + 1) +
                           ["--checkpoint_every=0", "--eval_every=1000"], env=ENV,
                           capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _summary(out)["reports"] == 2 * (saved + 1)
