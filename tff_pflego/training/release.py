"""Releases a run's metrics through `tff.program` release managers.

* `metrics.csv` (one row per all-client evaluation) and `rounds.csv` (one row per
  round): `tff.program.CSVFileReleaseManager`, keyed by `round`. Releasing round t
  first drops rows with round >= t, so a resumed run rewrites, never duplicates;
* `tensorboard/`: `tff.program.TensorBoardReleaseManager` (`round/...`, `eval/...`);
* the log: `tff.program.LoggingReleaseManager` (evaluations only).

Floats are released with 6 significant digits; `summary.json` is computed from the
released files, so a resumed run and an uninterrupted one report the same numbers.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
from typing import Mapping, Optional

import tensorflow_federated as tff

from tff_pflego.files import plain

METRICS_FILE = "metrics.csv"
ROUNDS_FILE = "rounds.csv"
KEY = "round"


def read_rows(path: str) -> list[dict[str, float]]:
  """The rows of a released CSV, numbers parsed, in round order."""
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    rows = [{k: float(v) if v not in ("", None) else math.nan for k, v in row.items()}
            for row in csv.DictReader(f)]
  return sorted(rows, key=lambda r: r[KEY])


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
    self._metrics = tff.program.CSVFileReleaseManager(self.metrics_path, key_fieldname=KEY)
    self._rounds = tff.program.CSVFileReleaseManager(self.rounds_path, key_fieldname=KEY)
    self._tensorboard = tff.program.TensorBoardReleaseManager(
        os.path.join(output_dir, "tensorboard"))
    self._log = tff.program.LoggingReleaseManager()

  def release_round(self, round_num: int, row: Mapping) -> None:
    value = {k: plain(v) for k, v in row.items() if k != KEY}
    asyncio.run(self._gather(
        self._rounds.release(value, round_num),
        self._tensorboard.release({"round": value}, round_num)))

  def release_evaluation(self, round_num: int, row: Mapping) -> None:
    value = {k: plain(v) for k, v in row.items() if k != KEY}
    asyncio.run(self._gather(
        self._metrics.release(value, round_num),
        self._tensorboard.release({"eval": value}, round_num),
        self._log.release({"eval": value}, round_num)))

  @staticmethod
  async def _gather(*releases) -> None:
    await asyncio.gather(*releases)
