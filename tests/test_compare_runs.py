"""binaries/compare_runs.py: the curves it saves are the runs' columns, the sampled one a
trailing mean over the last 10 rounds; it loads no TensorFlow."""

from __future__ import annotations

import csv
import gzip
import json
import os

import numpy as np

from tests.helpers import run_recording_tensorflow

# Rounds 1..12; the sampled protocol is missing (NaN) at rounds 3 and 4.
SAMPLED = [0.1 * k if k not in (3, 4) else None for k in range(1, 13)]
EVALS = [(0, 2.3, 1.9, 0.5, 0.6), (6, 1.2, 0.8, 0.7, 0.8), (12, 0.9, 0.5, 0.8, 0.9)]


def _write(path: str, header: list[str], rows: list) -> None:
  with (gzip.open(path + ".gz", "wt", newline="") if path.endswith("rounds.csv")
        else open(path, "w", newline="")) as f:  # a record's rounds.csv is gzipped
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])


def test_curves_are_the_runs_columns_and_tensorflow_never_loads(tmp_path):
  run = str(tmp_path / "run")
  os.makedirs(run)
  _write(os.path.join(run, "metrics.csv"),
         ["round", "train_loss", "train_loss_refit", "test_accuracy_mean",
          "test_accuracy_refit_mean"], EVALS)
  _write(os.path.join(run, "rounds.csv"), ["round", "test_accuracy_sampled_pooled"],
         [(k + 1, v) for k, v in enumerate(SAMPLED)])
  out = str(tmp_path / "compare" / "fig")
  result = run_recording_tensorflow(
      "compare_runs.py", [f"--runs={run}", "--labels=a", f"--output={out}"])
  assert result.stdout.splitlines()[-1] == "exit None []", result.stdout + result.stderr
  assert os.path.getsize(out + ".png") > 0
  with open(out + ".json") as f:
    curves = json.load(f)["curves"]["a"]
  assert curves["eval_round"] == [0, 6, 12]
  assert curves["train_loss_refit"] == [1.9, 0.8, 0.5]
  assert curves["test_accuracy_mean"] == [0.5, 0.7, 0.8]
  values = [np.nan if v is None else v for v in SAMPLED]
  expected = [np.nanmean(values[max(0, k - 9):k + 1]) for k in range(12)]
  assert np.allclose(curves["sampled_pooled_last10"], expected)
  assert curves["sampled_pooled_last10"][3] == np.mean([0.1, 0.2])  # rounds 1, 2 only
