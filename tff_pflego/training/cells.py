"""One cell of a study (a grid or an ablation): run it to the end, then read its figures.

`run_cell` runs (or resumes) one `experiment.ExperimentConfig`; a run whose TFF worker
dies (a crash outside the run's control, e.g. a segfault) resumes from its last
checkpoint, up to `WORKER_RETRIES` times: a resumed run equals an uninterrupted one
(tests/test_resume).

`run_or_continue(config, record_dir)` does the same for a cell that may outlive the
machine: a run parked in the cell's record (`tff_pflego/records.py`) further on than
the local one is unpacked first, and a run that stops before its end (a stop signal,
an error) is parked there (`PARKED` and its newest checkpoint), so the same command on
a fresh clone continues it (a state too large to archive stays in the run directory,
`records.park`, and a machine without it refuses the cell rather than silently start it
over: `refuse_a_lost_parked_run`). A finished cell's record keeps `RECORDED` (`records.keep`);
`source` is where a cell's finished run is read from (the run, else its record).
`kept_at` is where its results row says it is kept (the record, else the run).

`run_figures(directory)` reads a finished run's released files (metrics.csv: one row
per all-client evaluation; rounds.csv: one row per round; summary.json) and returns its
table figures: for each protocol, the mean and std over the last `WINDOW` evaluations
(all clients, round > 0) or rounds (sampled clients, right after their update), the
median wall and client seconds of its rounds, and L(psi)'s last value, its lowest, its
largest rise (`grid.largest_rise`) and its value after every client refits its head on
the final body.

`grid_failure(failed, cells)` is what a study whose other cells ran raises for the cells
that failed: exit 2 (`UserError`) only when the user's input is to blame for all of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

import numpy as np

from tff_pflego import records
from tff_pflego.records import finished  # the cells' test of a finished run
from tff_pflego.training.grid import largest_rise
from tff_pflego.training.run_files import (CLIENTS_FILE, CONFIG_FILE, MACHINES_FILE,
                                           METRICS_FILE, PARTITION_FILE, ROUNDS_FILE,
                                           SUMMARY_FILE, TENSORBOARD_DIR)

WINDOW = 10  # the paper's table entry: the mean over the final 10 rounds
WORKER_RETRIES = 2
METRIC = "test_accuracy_mean"
SAMPLED_METRIC = "test_accuracy_sampled_pooled"
REFIT_METRIC = "test_accuracy_refit_mean"
# A cell's record: what `run_figures` and the curves read (and the summary, kept last).
RECORDED = (CONFIG_FILE, METRICS_FILE, ROUNDS_FILE)
# What a parked (unfinished) cell keeps besides its newest checkpoint.
PARKED = RECORDED + (PARTITION_FILE, CLIENTS_FILE, MACHINES_FILE, TENSORBOARD_DIR)


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


def checkpoint_round(files: Sequence[str]) -> int:
  """The newest checkpoint's round among a run's `files` (paths relative to the run;
  -1 if none)."""
  from tff_pflego.training import checkpoints, driver
  prefix = os.path.join(driver.CHECKPOINT_DIR, checkpoints.PREFIX)
  rounds = [int(f[len(prefix):].split(os.sep)[0]) for f in files if f.startswith(prefix)
            and f[len(prefix):].split(os.sep)[0].isdigit()]
  return max(rounds, default=-1)


def run_files(run_dir: str) -> list[str]:
  """Every file under `run_dir`, relative to it."""
  return [os.path.relpath(os.path.join(root, n), run_dir)
          for root, _, names in os.walk(run_dir) for n in names]


def run_or_continue(config, record_dir: Optional[str]) -> None:
  """Runs `config` (an ExperimentConfig; `run_cell`), first unpacking a run parked in
  `record_dir` that is further on than the one in `config.output_dir`; with a
  `record_dir`, a run that stops before its end is parked there (its newest checkpoint
  and `PARKED`)."""
  from tff_pflego.training import checkpoints, driver
  run = config.output_dir
  if records.parked(record_dir):
    parked_round = checkpoint_round(records.parked_files(record_dir))
    if parked_round > checkpoint_round(run_files(run)):
      print(f"  continuing the run parked in {record_dir} at round {parked_round}",
            flush=True)
      records.unpark(record_dir, run)
  refuse_a_lost_parked_run(record_dir, run)
  try:
    run_cell(config)
  finally:
    stopped_at = checkpoint_round(run_files(run))
    if record_dir and stopped_at >= 0 and not finished(run):
      with open(os.path.join(run, CONFIG_FILE)) as f:
        facts = dict(round=stopped_at, rounds=json.load(f)["rounds"])
      if records.park(run, record_dir, PARKED + (os.path.join(
          driver.CHECKPOINT_DIR, f"{checkpoints.PREFIX}{stopped_at}"),), facts):
        print(f"  stopped at round {stopped_at}: parked in "
              f"{os.path.join(record_dir, records.UNFINISHED)}", flush=True)
      else:
        print(f"  stopped at {parked_state(record_dir)} (noted in "
              f"{os.path.join(record_dir, records.PARKED_LOCALLY)})", flush=True)


def refuse_a_lost_parked_run(record_dir: Optional[str], run: str) -> None:
  """Raises a UserError if `record_dir` notes a run parked too large to archive
  (`records.parked_locally`) further on than the run in `run`: its state is on another
  machine (or was lost with it), and starting over here would overwrite that note."""
  from tff_pflego.errors import UserError
  kept = records.parked_locally(record_dir) if record_dir else None
  here = checkpoint_round(run_files(run))
  if kept is not None and kept["round"] > here:
    raise UserError(
        f"the run was parked at round {kept['round']} of {kept['rounds']} in "
        f"`{kept['kept_in']}` (too large for its record) and `{run}` holds "
        + (f"round {here} only" if here >= 0 else "no checkpoint of it")
        + ": continue it on the machine holding that directory, or delete "
        f"{os.path.join(record_dir, records.PARKED_LOCALLY)} to start it over")


def parked_state(record_dir: str) -> Optional[str]:
  """Where the unfinished run parked in `record_dir` stopped ("round 4 of 50", and where
  it stays if too large to archive), or None if none is parked there."""
  if records.finished(record_dir):
    return None
  if records.parked(record_dir):
    rounds = json.loads(records.parked_file(record_dir, CONFIG_FILE))["rounds"]
    return f"round {checkpoint_round(records.parked_files(record_dir))} of {rounds}"
  kept = records.parked_locally(record_dir)
  if kept is None:
    return None
  return (f"round {kept['round']} of {kept['rounds']}, its state "
          f"({kept['archive_bytes'] / 2**20:.0f} MiB gzipped) too large for its record "
          f"(at most {kept['max_bytes'] / 2**20:.0f} MiB): only the machine holding "
          f"`{kept['kept_in']}` continues it")


def first_line(error: BaseException) -> str:
  """The first line of `error`'s message (its type's name if it has none)."""
  return (str(error).strip().splitlines() or [type(error).__name__])[0]


def grid_failure(failed: Sequence[tuple[str, Exception]], cells: int) -> Exception:
  """The one-line error for `failed` ((cell name, its error) pairs) out of `cells`
  cells: a UserError when every failure is one (exit 2), else a RuntimeFailure (exit 1:
  a lost worker or a defect is not the user's to fix)."""
  from tff_pflego.errors import RuntimeFailure, UserError
  users_only = all(isinstance(error, UserError) for _, error in failed)
  return (UserError if users_only else RuntimeFailure)(
      f"{len(failed)} of {cells} cells failed (the others ran): "
      + "; ".join(f"{name} ({first_line(error)})" for name, error in failed))


def source(run_dir: str, record_dir: Optional[str]) -> Optional[str]:
  """The cell's finished run, else its record, else None (not finished)."""
  for directory in (run_dir, record_dir):
    if directory and finished(directory):
      return directory
  return None


def kept_at(run_dir: str, record_dir: Optional[str]) -> str:
  """Where a results row says its finished cell is kept: the record when there is one
  (it holds the run's table files and travels with the docs), else the run, so a
  committed table never names a directory only one machine had."""
  return record_dir if record_dir and finished(record_dir) else run_dir


def run_figures(directory: str, window: int = WINDOW) -> dict:
  """A finished run's table figures (see the module docstring)."""
  from tff_pflego.training.release import read_rows  # loads TFF: only when needed
  with open(os.path.join(directory, SUMMARY_FILE)) as f:
    summary = json.load(f)
  evals = [r for r in read_rows(os.path.join(directory, METRICS_FILE)) if r["round"] > 0]
  last = np.array([r[METRIC] for r in evals[-window:]])
  refit = np.array([r.get(REFIT_METRIC, np.nan) for r in evals[-window:]])
  rounds = read_rows(os.path.join(directory, ROUNDS_FILE))
  sampled = np.array([r[SAMPLED_METRIC] for r in rounds[-window:]])
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
              time_per_round_s=_median(rounds, "round_time_s"),
              client_time_per_round_s=_median(rounds, "client_time_s"))


def _median(rounds: Sequence[dict], key: str) -> Optional[float]:
  """The median of a rounds.csv column (None if it has none): a run paused or slowed
  for a few rounds (another job, a machine change) keeps its typical round's cost."""
  values = [r[key] for r in rounds if r.get(key) is not None]
  return float(np.median(values)) if values else None
