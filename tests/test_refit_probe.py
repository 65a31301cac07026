"""binaries/refit_probe.py: its protocol row is the run's own last refit evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ENV, REPO, tiny_run
from tff_pflego.training.release import read_rows

PROBE = [sys.executable, os.path.join(REPO, "binaries", "refit_probe.py")]


def test_refit_probe_reproduces_the_runs_last_refit(prepared, tmp_path):
  run = str(tmp_path / "run")
  done = subprocess.run(tiny_run(prepared, run), env=ENV, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  probe = subprocess.run(PROBE + [f"--run_dir={run}", "--steps=1,20",
                                  "--starts=stored,zero"],
                         env=ENV, capture_output=True, text=True, timeout=600)
  assert probe.returncode == 0, probe.stderr[-3000:]
  with open(os.path.join(run, "refit_probe.json")) as f:
    results = json.load(f)["results"]
  last = read_rows(os.path.join(run, "metrics.csv"))[-1]
  assert last["round"] == 2
  # tau - 1 = 1 step from the stored heads: the run's evaluation protocol at round 2.
  assert abs(results["stored/1"]["train_loss"] - last["train_loss_refit"]) < 1e-5
  assert abs(results["stored/1"]["test_accuracy_mean"]
             - last["test_accuracy_refit_mean"]) < 1e-6
  # The other rows are other refits (the comparison above can fail).
  assert results["zero/1"]["train_loss"] != results["stored/1"]["train_loss"]
  assert results["stored/20"]["train_loss"] < results["stored/1"]["train_loss"]


def test_refit_probe_refuses_a_directory_without_a_run(tmp_path):
  probe = subprocess.run(PROBE + [f"--run_dir={tmp_path}"], env=ENV, capture_output=True,
                         text=True, timeout=300)
  assert probe.returncode == 2
  errors = [l for l in probe.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "holds no run" in errors[0] and "Traceback" not in probe.stderr
