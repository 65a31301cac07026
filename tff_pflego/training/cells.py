"""One cell of a study (a grid or an ablation): run it to the end, then read its figures.

`run_cell` runs (or resumes) one `experiment.ExperimentConfig`; a run whose TFF worker
dies (a crash outside the run's control, e.g. a segfault) resumes from its last
checkpoint, up to `WORKER_RETRIES` times: a resumed run equals an uninterrupted one
(tests/test_resume).

`run_figures(directory)` reads a finished run's released files (metrics.csv: one row
per all-client evaluation; rounds.csv: one row per round; summary.json) and returns its
table figures: for each protocol, the mean and std over the last `WINDOW` evaluations
(all clients, round > 0) or rounds (sampled clients, right after their update), and
L(psi)'s last value, its lowest, its largest rise (`grid.largest_rise`) and its value after
every client refits its head on the final body.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from tff_pflego.records import finished  # noqa: F401 (the cells' test of a finished run)
from tff_pflego.training.grid import largest_rise

WINDOW = 10  # the paper's table entry: the mean over the final 10 rounds
WORKER_RETRIES = 2
METRIC = "test_accuracy_mean"
SAMPLED_METRIC = "test_accuracy_sampled_pooled"
REFIT_METRIC = "test_accuracy_refit_mean"


def resuming(config):
  """`config` (an ExperimentConfig) set to resume a cut run from its checkpoint, or
  else to start afresh in its directory."""
  from tff_pflego.experiment import has_checkpoint
  return dataclasses.replace(config, overwrite=not has_checkpoint(config.output_dir))


def run_cell(config, retries: int = WORKER_RETRIES) -> None:
  """Runs `config` (an ExperimentConfig) to its end (`resuming`); retries after a
  lost TFF worker."""
  from tff_pflego.errors import WorkerLostError
  from tff_pflego.experiment import run_experiment
  for attempt in range(retries + 1):
    try:
      run_experiment(resuming(config))
      return
    except WorkerLostError as e:
      if attempt == retries:
        raise
      print(f"  {e}; resuming the cell from its checkpoint "
            f"(retry {attempt + 1} of {retries})", flush=True)


def run_figures(directory: str, window: int = WINDOW) -> dict:
  """A finished run's table figures (see the module docstring)."""
  from tff_pflego.training.release import read_rows  # loads TFF: only when needed
  with open(os.path.join(directory, "summary.json")) as f:
    summary = json.load(f)
  evals = [r for r in read_rows(os.path.join(directory, "metrics.csv")) if r["round"] > 0]
  last = np.array([r[METRIC] for r in evals[-window:]])
  refit = np.array([r.get(REFIT_METRIC, np.nan) for r in evals[-window:]])
  sampled = np.array([r[SAMPLED_METRIC]
                      for r in read_rows(os.path.join(directory, "rounds.csv"))[-window:]])
  losses = [r["train_loss"] for r in evals]
  return dict(rounds=summary["rounds"],
              accuracy_mean=float(last.mean()), accuracy_std=float(last.std()),
              sampled_pooled_mean=float(np.nanmean(sampled)),
              sampled_pooled_std=float(np.nanstd(sampled)),
              refit_mean=float(refit.mean()), refit_std=float(refit.std()),
              train_loss_last=float(losses[-1]), train_loss_min=float(np.min(losses)),
              train_loss_largest_rise=largest_rise(losses),
              train_loss_refit_final=evals[-1].get("train_loss_refit"),
              train_loss_mean=summary["final"]["train_loss"],
              time_per_round_s=summary["time_per_round_s"],
              client_time_per_round_s=summary.get("client_time_per_round_s"))
