"""Releases a run's metrics through `tff.program` release managers.

* `metrics.csv` (one row per all-client evaluation) and `rounds.csv` (one row per
  round), keyed by `round`: `CsvRows` appends each row with `csv.DictWriter`. A
  resumed run first drops the rows after its checkpoint (`truncate_after`), so it
  rewrites, never duplicates;
* `tensorboard/`: `tff.program.TensorBoardReleaseManager` (`round/...`, `eval/...`);
* the log: `tff.program.LoggingReleaseManager` (evaluations only).

Floats are released with 6 significant digits; `summary.json` is computed from the
released files, so a resumed run and an uninterrupted one report the same numbers.
"""

from __future__ import annotations

import asyncio
import csv
import os
from typing import Mapping, Optional

import tensorflow_federated as tff

from tff_pflego import records
from tff_pflego.files import plain
from tff_pflego.training import program_io
from tff_pflego.training.run_files import METRICS_FILE, ROUNDS_FILE, TENSORBOARD_DIR

KEY = records.ROUND


read_rows = records.read_rows  # the rows of a released CSV or of its record


def truncate_after(path: str, round_num: int) -> None:
  """Drops the rows of rounds > round_num (written after the checkpoint resumed from)."""
  if not os.path.exists(path):
    return
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    fieldnames, rows = reader.fieldnames or [KEY], list(reader)
  kept = [r for r in rows if float(r[KEY]) <= round_num]
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(kept)
  os.replace(tmp, path)


class CsvRows:
  """Appends rows to a CSV file, the header taken from the first row.

  `tff.program.CSVFileReleaseManager` reads and rewrites the whole file at every
  release (its removal of rows with key >= the released one runs whenever a row was
  released before), so round t cost O(t): 12 ms at round 300, 40 ms at round 1200
  (docs/round_profile.md). Appending costs the same at every round.
  """

  def __init__(self, path: str):
    self.path = path
    self._fieldnames: Optional[list[str]] = None
    if os.path.exists(path):
      with open(path, newline="") as f:
        self._fieldnames = next(csv.reader(f), None)

  def append(self, key: int, value: Mapping) -> None:
    row = {KEY: key, **value}
    if self._fieldnames is not None and set(row) <= set(self._fieldnames):
      with open(self.path, "a", newline="") as f:
        csv.DictWriter(f, fieldnames=self._fieldnames).writerow(row)
      return
    # First row, or new columns (a run's columns are fixed by its settings: only a
    # resumed run of an older version gets here): rewrite with the union of columns.
    rows = read_rows(self.path) if self._fieldnames else []
    self._fieldnames = list(self._fieldnames or []) + [
        k for k in row if k not in (self._fieldnames or [])]
    tmp = self.path + ".tmp"
    with open(tmp, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=self._fieldnames)
      writer.writeheader()
      writer.writerows(rows + [row])
    os.replace(tmp, self.path)


class RunReleaser:
  """The release managers of one run directory."""

  def __init__(self, output_dir: str, resume_from: Optional[int]):
    self.metrics_path = os.path.join(output_dir, METRICS_FILE)
    self.rounds_path = os.path.join(output_dir, ROUNDS_FILE)
    for path in (self.metrics_path, self.rounds_path):
      if resume_from is None:
        if os.path.exists(path):
          os.remove(path)  # a fresh run over an old one (--overwrite was given)
      else:
        truncate_after(path, resume_from)
    self._metrics = CsvRows(self.metrics_path)
    self._rounds = CsvRows(self.rounds_path)
    self._tensorboard = tff.program.TensorBoardReleaseManager(
        os.path.join(output_dir, TENSORBOARD_DIR))
    self._log = tff.program.LoggingReleaseManager()

  def release_round(self, round_num: int, row: Mapping) -> None:
    value = {k: plain(v) for k, v in row.items() if k != KEY}
    self._rounds.append(round_num, value)
    program_io.run(self._tensorboard.release({"round": value}, round_num))

  def release_evaluation(self, round_num: int, row: Mapping) -> None:
    value = {k: plain(v) for k, v in row.items() if k != KEY}
    self._metrics.append(round_num, value)
    program_io.run(self._gather(
        self._tensorboard.release({"eval": value}, round_num),
        self._log.release({"eval": value}, round_num)))

  @staticmethod
  async def _gather(*releases) -> None:
    await asyncio.gather(*releases)
