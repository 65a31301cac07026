"""Run outputs written directly: clients.csv, summary.json, config.json."""

from __future__ import annotations

import csv
import json
import os
from typing import Mapping, Sequence

import numpy as np


class CsvWriter:
  """Appends rows to a CSV file, flushing each one so a killed run loses nothing."""

  def __init__(self, path: str, fieldnames: Sequence[str]):
    self.path = path
    self._file = open(path, "w", newline="")
    self._writer = csv.DictWriter(self._file, fieldnames=list(fieldnames),
                                  extrasaction="ignore")
    self._writer.writeheader()
    self._file.flush()

  def write(self, row: Mapping) -> None:
    self._writer.writerow({k: _plain(v) for k, v in row.items()})
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _plain(value):
  if isinstance(value, (np.floating, float)):
    return f"{float(value):.6g}"
  if isinstance(value, np.ndarray):
    return " ".join(str(v) for v in value.tolist())
  if isinstance(value, np.integer):
    return int(value)
  return value


def write_json(path: str, data: Mapping) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2, default=_plain)
    f.write("\n")
  os.replace(tmp, path)
