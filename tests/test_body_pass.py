"""binaries/benchmark_body_pass.py: a run's round set beside its counted body passes.

The run directory is written here (config.json and a gzipped rounds.csv with chosen
values), so the medians, the mean client size and the predicted round are checked
against numbers computed from those values, not read back from the benchmark's code.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import ENV, REPO

BENCHMARK = [sys.executable, os.path.join(REPO, "binaries", "benchmark_body_pass.py"),
             "--repeats=1", "--datasets="]

# round_time_s, num_reports, num_examples, body_forward_passes, body_backward_passes
ROUNDS = [(4.0, 4, 80.0, 7.0, 2.0), (6.0, 4, 88.0, 7.0, 2.0), (5.0, 3, 66.0, 7.0, 2.0),
          (9.0, 0, 0.0, float("nan"), float("nan"))]  # no reports: left out


def _write_run(run_dir) -> None:
  os.makedirs(run_dir)
  with open(os.path.join(run_dir, "config.json"), "w") as f:
    json.dump(dict(dataset="fashion_mnist", algorithm="fedrep"), f)
  with gzip.open(os.path.join(run_dir, "rounds.csv.gz"), "wt", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["round", "round_time_s", "num_reports", "num_examples",
                     "body_forward_passes", "body_backward_passes"])
    for i, row in enumerate(ROUNDS, start=1):
      writer.writerow([i, *row])


def test_round_is_set_beside_its_body_passes(tmp_path):
  run_dir, out = str(tmp_path / "run"), str(tmp_path / "out")
  _write_run(run_dir)
  result = subprocess.run(BENCHMARK + [f"--runs={run_dir}", f"--output_dir={out}"],
                          env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(out, "body_pass.json")) as f:
    saved = json.load(f)
  assert os.path.getsize(os.path.join(out, "body_pass.png")) > 0
  assert saved["bodies"] == []
  (run,) = saved["runs"]
  reported = ROUNDS[:3]
  assert run["rounds"] == 3
  assert run["round_s"] == 5.0 and run["clients"] == 4.0
  assert run["examples"] == round(np.mean([e / n for _, n, e, _, _ in reported]))  # 21
  assert run["passes"]["examples"] == 21 and run["passes"]["body"] == "mlp"
  forward, both = run["passes"]["forward_s"], run["passes"]["forward_backward_s"]
  assert 0 < forward and 0 < both
  # 4 clients x (5 forward-only passes + 2 forward-and-backward passes)
  assert run["predicted_round_s"] == pytest.approx(4 * (5 * forward + 2 * both))
  assert run["unexplained"] == pytest.approx(1 - run["predicted_round_s"] / 5.0)


@pytest.mark.parametrize("flag, message", [
    ("--runs={missing}", "--runs {missing}: not a run directory"),
    ("--datasets=mnist", "--datasets: mnist not one of"),
    ("--datasets=", "nothing to measure"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, flag, message):
  missing, out = str(tmp_path / "missing"), str(tmp_path / "out")
  result = subprocess.run(BENCHMARK[:-1] + [flag.format(missing=missing),
                                            f"--output_dir={out}"],
                          env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  assert result.stderr.strip().count("\n") == 0, result.stderr
  assert message.format(missing=missing) in result.stderr
  assert not os.path.exists(out)
