"""Run outputs written row by row: clients.csv (summary.json and config.json go through
`tff_pflego.files.write_json`)."""

from __future__ import annotations

import csv
from typing import Mapping, Sequence

from tff_pflego.files import plain


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
    self._writer.writerow({k: plain(v) for k, v in row.items()})
    self._file.flush()

  def close(self) -> None:
    self._file.close()
