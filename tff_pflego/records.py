"""Run records that outlive the machine, and claims that let grids share a directory.

A grid's runs live in an output directory that is not in git (checkpoints, TensorBoard
logs). Its figures and tables must not depend on that directory surviving: a *record*
keeps what they are drawn from -- the run's summary.json as it is and its metrics.csv
gzipped (byte-stable: no timestamp in the gzip header) -- in a directory that is
committed, so a fresh clone redraws every figure and table without running anything.

A *claim* (`<run_dir>.claim`, holding the claiming process's pid) marks a run as being
made, so two grid invocations over one output directory never run the same cell at
once; a claim whose process is gone is stale and is taken over.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import os
from typing import Iterator, Optional

from tff_pflego import files

SUMMARY = "summary.json"
METRICS = "metrics.csv"
METRICS_RECORD = METRICS + ".gz"


def finished(directory: str) -> bool:
  """Whether `directory` holds a finished run or its record (summary.json is written
  last)."""
  return os.path.exists(os.path.join(directory, SUMMARY))


def keep(run_dir: str, record_dir: str) -> None:
  """Writes the record of the finished run in `run_dir` to `record_dir` (atomically,
  file by file; the summary last, so a record with a summary is whole)."""
  os.makedirs(record_dir, exist_ok=True)
  with open(os.path.join(run_dir, METRICS), "rb") as f:
    metrics = f.read()
  path = os.path.join(record_dir, METRICS_RECORD)
  with open(path + ".tmp", "wb") as raw:
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
      packed.write(metrics)
  os.replace(path + ".tmp", path)
  files.copy_file(os.path.join(run_dir, SUMMARY), os.path.join(record_dir, SUMMARY))


def read_metrics(directory: str) -> list[dict]:
  """The metrics rows (every value a float) of a run directory or of a record."""
  path = os.path.join(directory, METRICS)
  if os.path.exists(path):
    with open(path) as f:
      text = f.read()
  else:
    with gzip.open(os.path.join(directory, METRICS_RECORD), "rt") as f:
      text = f.read()
  return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # someone else's process
    return True
  return True


def holder(run_dir: str) -> Optional[int]:
  """The pid of the live process that claims `run_dir`, else None."""
  try:
    with open(run_dir + ".claim") as f:
      pid = int(f.read().strip() or 0)
  except (FileNotFoundError, ValueError):
    return None
  return pid if pid and _alive(pid) else None


def _take(run_dir: str) -> bool:
  """Creates `<run_dir>.claim` with this process's pid unless a live process holds it."""
  path = run_dir + ".claim"
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  mine = f"{path}.{os.getpid()}"
  with open(mine, "w") as f:
    f.write(f"{os.getpid()}\n")
  try:
    for _ in range(2):
      try:
        os.link(mine, path)  # atomic, and the claim is never seen without its pid
        return True
      except FileExistsError:
        if holder(run_dir) is not None:
          return False
        with contextlib.suppress(FileNotFoundError):
          os.remove(path)  # stale: its process is gone
    return False  # another process took the stale claim first
  finally:
    os.remove(mine)


@contextlib.contextmanager
def claim(run_dir: str) -> Iterator[bool]:
  """Claims `run_dir` for this process while the block runs; yields False (and claims
  nothing) when a live process already holds it. A stale claim is taken over."""
  if not _take(run_dir):
    yield False
    return
  try:
    yield True
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(run_dir + ".claim")
