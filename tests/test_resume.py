"""Checkpoints: a run killed with SIGKILL and resumed ends exactly as an uninterrupted one."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time

import numpy as np
import tensorflow as tf

from tests.test_processes import ENV, tiny_run

ROUNDS = 6
TIMING_COLUMNS = {"wall_time_s", "round_time_s", "client_time_s", "client_compute_s",
                  "client_time_max_s", "server_time_s"}


def _run_args(data_dir, output_dir):
  return tiny_run(data_dir, output_dir, rounds=ROUNDS) + ["--checkpoint_every=1"]


def _rows(path):
  with open(path, newline="") as f:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS}
            for row in csv.DictReader(f)]


def _checkpoint_values(output_dir, round_num):
  """The checkpoint's values but the wall time it records."""
  module = tf.saved_model.load(os.path.join(output_dir, "checkpoints", f"round_{round_num}"))
  state = dict(module())
  assert "elapsed_s" in state
  del state["elapsed_s"]
  return [np.asarray(v.numpy() if hasattr(v, "numpy") else v)
          for v in tf.nest.flatten(state)]


def test_sigkilled_run_resumes_to_the_uninterrupted_result(prepared, tmp_path):
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  done = subprocess.run(_run_args(prepared, straight), env=ENV, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]

  proc = subprocess.Popen(_run_args(prepared, killed), env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + 300
  while not os.path.exists(killed / "checkpoints" / "round_3"):
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait(60)
  summary_before = json.loads((killed / "summary.json").read_text()) if (
      killed / "summary.json").exists() else None
  assert summary_before is None  # it really was cut short

  resumed = subprocess.run(_run_args(prepared, killed), env=ENV, capture_output=True,
                           text=True, timeout=600)  # same command: resumes by default
  assert resumed.returncode == 0, resumed.stderr[-3000:]

  a = json.loads((straight / "summary.json").read_text())
  b = json.loads((killed / "summary.json").read_text())
  assert a["final"] == b["final"]
  for name in ("metrics.csv", "rounds.csv", "clients.csv"):
    assert _rows(straight / name) == _rows(killed / name), name
  assert [int(r["round"]) for r in _rows(killed / "rounds.csv")] == list(range(1, ROUNDS + 1))
  values_a, values_b = (_checkpoint_values(d, ROUNDS) for d in (straight, killed))
  assert len(values_a) == len(values_b) > 10
  for x, y in zip(values_a, values_b):
    np.testing.assert_array_equal(x, y)
