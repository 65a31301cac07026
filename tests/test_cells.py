"""cells.run_cell: a lost TFF worker resumes the cell from its checkpoint, a bounded
number of times; any other failure is not retried; a grid's failed cells make one error."""

import dataclasses
import os

import pytest

from tff_pflego import experiment
from tff_pflego.errors import RuntimeFailure, UserError, WorkerLostError
from tff_pflego.training import cells, checkpoints, driver


@dataclasses.dataclass
class _Config:
  output_dir: str
  overwrite: bool = False


def _fake_run(failures: int, error: Exception, calls: list):
  """A run_experiment that saves a checkpoint and then loses its worker `failures` times."""
  def run(config):
    calls.append(config.overwrite)
    directory = os.path.join(config.output_dir, driver.CHECKPOINT_DIR)
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f"{checkpoints.PREFIX}{len(calls)}"), "w").close()
    if len(calls) <= failures:
      raise error
  return run


def test_lost_worker_resumes_from_the_checkpoint(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(experiment, "run_experiment",
                      _fake_run(2, WorkerLostError("worker exited with -11"), calls))
  cells.run_cell(_Config(str(tmp_path / "cell")))
  # A fresh directory starts afresh; both retries resume what the lost run saved.
  assert calls == [True, False, False]


def test_retries_are_bounded(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(experiment, "run_experiment",
                      _fake_run(10, WorkerLostError("worker exited with -11"), calls))
  with pytest.raises(WorkerLostError):
    cells.run_cell(_Config(str(tmp_path / "cell")), retries=3)
  assert len(calls) == 4


def test_other_failures_are_not_retried(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(experiment, "run_experiment",
                      _fake_run(1, UserError("bad flag"), calls))
  with pytest.raises(UserError):
    cells.run_cell(_Config(str(tmp_path / "cell")))
  assert calls == [True]


def test_a_grid_exits_2_only_when_every_failed_cell_failed_on_the_users_input():
  """One lost worker among user errors makes the grid's failure exit 1, not 2; the
  line names every failed cell with its error's first line, in order."""
  user = ("mnist/high/pflego/0", UserError("--output_dir x is a file\nmore"))
  lost = ("mnist/high/fedavg/0", WorkerLostError("worker exited with -11"))
  assert type(cells.grid_failure([user], 3)) is UserError
  mixed = cells.grid_failure([user, lost], 3)
  assert type(mixed) is RuntimeFailure
  assert str(mixed) == ("2 of 3 cells failed (the others ran): mnist/high/pflego/0 "
                        "(--output_dir x is a file); mnist/high/fedavg/0 "
                        "(worker exited with -11)")
  defect = cells.grid_failure([user, ("cifar10/high/ditto/1", ValueError())], 3)
  assert type(defect) is RuntimeFailure and str(defect).endswith("(ValueError)")
