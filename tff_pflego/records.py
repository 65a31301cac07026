"""Run records that outlive the machine, and claims that let grids share a directory.

A grid's runs live in an output directory that is not in git (checkpoints, TensorBoard
logs). Its figures and tables must not depend on that directory surviving: a *record*
keeps what they are drawn from -- the run's summary.json as it is and its metrics.csv
gzipped (byte-stable: no timestamp in the gzip header) -- in a directory that is
committed, so a fresh clone redraws every figure and table without running anything.

An unfinished run is *parked* in its record directory (`unfinished.tar.gz`: its logs and
newest checkpoint, byte-stable too) so a run longer than a machine's session continues
on the next machine; its checkpoint's fingerprint decides there whether it may resume.
The record of the finished run replaces it. A parked run whose archive would exceed
`MAX_PARKED_BYTES` (a Ditto cell's personal models: ~650 MB gzipped on CIFAR-10) is not
archived: `unfinished.json` in its record says where it stays and at which round, and
only the machine holding that run directory continues it. Where a session's machine
may not outlive the session (this project's: some did, some did not), such a run is
sure to finish only if it fits in one session: the CIFAR-10 Ditto cell at T = 50
(7.3-13 h on 2 cores) does not.

A *claim* (`<run_dir>.claim`, locked with `flock` by the claiming process and holding
its pid) marks a run as being made, so two grid invocations over one output directory
never run the same cell at once; the claim of a process that is gone is free.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import gzip
import io
import json
import math
import os
import tarfile
from typing import Iterator, Optional, Sequence

from tff_pflego import files
from tff_pflego.training.run_files import METRICS_FILE, PARTITION_FILE, SUMMARY_FILE

ROUND = "round"  # the key column of a run's CSVs
RECORD = "record.json"  # facts about the run its kept files do not hold
UNFINISHED = "unfinished.tar.gz"  # a parked run
PARKED_LOCALLY = "unfinished.json"  # a parked run too large to archive in its record
MAX_PARKED_BYTES = 50 * 2**20  # GitHub warns of a file above 50 MB, refuses one above 100


def finished(directory: str) -> bool:
  """Whether `directory` holds a finished run or its record (summary.json is written
  last)."""
  return os.path.exists(os.path.join(directory, SUMMARY_FILE))


def partition_fingerprint(directory: str) -> Optional[str]:
  """The fingerprint of the partition the run or record in `directory` trained on: from
  its summary.json's data provenance if finished, else its partition.json, else (a
  record whose summary predates the fingerprint) its record.json; None if none has one."""
  for name, key in ((SUMMARY_FILE, ("data_provenance",)), (PARTITION_FILE, ()),
                    (RECORD, ())):
    path = os.path.join(directory, name)
    if os.path.exists(path):
      with open(path) as f:
        content = json.load(f)
      for step in key:
        content = content.get(step, {})
      if content.get("partition_fingerprint"):
        return content["partition_fingerprint"]
  return None


class _CappedWriter:
  """A file object for `gzip.GzipFile` that writes to `raw` while the bytes written
  stay within `limit` (None: no limit) and past it only counts them, so an archive
  over its budget costs no disk space (the disk may hold less than the archive)."""

  def __init__(self, raw, limit: Optional[int]):
    self.raw, self.limit, self.size = raw, limit, 0

  def write(self, chunk) -> int:
    self.size += len(chunk)
    if not self.over():
      self.raw.write(chunk)
    return len(chunk)

  def flush(self) -> None:
    self.raw.flush()

  def over(self) -> bool:
    return self.limit is not None and self.size > self.limit


def _write_gzip(path: str, data: bytes, max_bytes: Optional[int] = None) -> int:
  """Writes `data` gzipped to `path` atomically, with no timestamp in the header (the
  bytes depend on `data` alone), unless the gzipped bytes exceed `max_bytes`: then
  nothing is written, and no more than `max_bytes` ever reach the disk. Returns the
  gzipped size."""
  with open(path + ".tmp", "wb") as raw:
    sink = _CappedWriter(raw, max_bytes)
    with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0) as packed:
      packed.write(data)
  if sink.over():
    os.remove(path + ".tmp")
  else:
    os.replace(path + ".tmp", path)
  return sink.size


def keep(run_dir: str, record_dir: str, names: Sequence[str] = (METRICS_FILE,),
         facts: Optional[dict] = None) -> None:
  """Writes the record of the finished run in `run_dir` to `record_dir`: `names`
  (CSV files gzipped, others as they are; one missing from the run is removed from the
  record too), `facts` as record.json, and then the summary, so a record with a
  summary is whole. Each file is written atomically."""
  os.makedirs(record_dir, exist_ok=True)
  if facts is not None:
    files.write_json(os.path.join(record_dir, RECORD), facts)
  for name in names:
    source = os.path.join(run_dir, name)
    if not os.path.exists(source):
      for stale in (name, name + ".gz"):
        with contextlib.suppress(FileNotFoundError):
          os.remove(os.path.join(record_dir, stale))
      continue
    if not name.endswith(".csv"):
      files.copy_file(source, os.path.join(record_dir, name))
      continue
    with open(source, "rb") as f:
      _write_gzip(os.path.join(record_dir, name + ".gz"), f.read())
  files.copy_file(os.path.join(run_dir, SUMMARY_FILE), os.path.join(record_dir, SUMMARY_FILE))
  _remove(record_dir, (UNFINISHED, PARKED_LOCALLY))


def _remove(directory: str, names: Sequence[str]) -> None:
  """Removes `names` from `directory` where they exist."""
  for name in names:
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(directory, name))


def _walk(run_dir: str, paths: Sequence[str]) -> list[str]:
  """The files under `paths` (relative to `run_dir`; a directory: all its files),
  sorted."""
  found = []
  for path in paths:
    full = os.path.join(run_dir, path)
    if os.path.isfile(full):
      found.append(path)
    for root, _, names in os.walk(full):
      found += [os.path.relpath(os.path.join(root, n), run_dir) for n in names]
  return sorted(set(found))


def park(run_dir: str, record_dir: str, paths: Sequence[str], facts: dict,
         max_bytes: int = MAX_PARKED_BYTES) -> bool:
  """Keeps the unfinished run in `run_dir` as `record_dir`/unfinished.tar.gz: the files
  under `paths` (relative to `run_dir`), with no owners or times, so the archive's
  bytes depend only on the files' names and contents. An archive above `max_bytes` is
  not written: `record_dir`/unfinished.json holds `facts`, `run_dir` and the sizes
  instead. Returns whether the archive was written; the other file is removed."""
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
    for name in _walk(run_dir, paths):
      with open(os.path.join(run_dir, name), "rb") as f:
        data = f.read()
      info = tarfile.TarInfo(name)
      info.size, info.mode = len(data), 0o644
      archive.addfile(info, io.BytesIO(data))
  os.makedirs(record_dir, exist_ok=True)
  size = _write_gzip(os.path.join(record_dir, UNFINISHED), buffer.getvalue(), max_bytes)
  archived = size <= max_bytes
  if not archived:
    files.write_json(os.path.join(record_dir, PARKED_LOCALLY), dict(
        facts, kept_in=run_dir, archive_bytes=size, max_bytes=max_bytes))
  _remove(record_dir, (PARKED_LOCALLY,) if archived else (UNFINISHED,))
  return archived


def parked_locally(record_dir: str) -> Optional[dict]:
  """What `record_dir`/unfinished.json says of a run parked too large to archive (the
  `facts` given to `park`, `kept_in`, `archive_bytes`, `max_bytes`), or None."""
  path = os.path.join(record_dir, PARKED_LOCALLY)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def parked(record_dir: Optional[str]) -> bool:
  """Whether `record_dir` holds a parked run."""
  return bool(record_dir) and os.path.exists(os.path.join(record_dir, UNFINISHED))


def parked_files(record_dir: str) -> list[str]:
  """The files of the run parked in `record_dir` (relative paths)."""
  with tarfile.open(os.path.join(record_dir, UNFINISHED), "r:gz") as archive:
    return archive.getnames()


def parked_file(record_dir: str, name: str) -> bytes:
  """The contents of `name` (a path relative to the run) in the run parked in
  `record_dir`."""
  with tarfile.open(os.path.join(record_dir, UNFINISHED), "r:gz") as archive:
    return archive.extractfile(name).read()


def unpark(record_dir: str, run_dir: str) -> None:
  """Unpacks the run parked in `record_dir` into `run_dir` (its files replace those of
  the same name)."""
  with tarfile.open(os.path.join(record_dir, UNFINISHED), "r:gz") as archive:
    archive.extractall(run_dir, filter="data")


def read_text(path: str) -> Optional[str]:
  """The text of `path`, or of its record `path`.gz; None if neither exists."""
  if os.path.exists(path):
    with open(path, newline="") as f:
      return f.read()
  if os.path.exists(path + ".gz"):
    with gzip.open(path + ".gz", "rt", newline="") as f:
      return f.read()
  return None


def read_rows(path: str) -> list[dict[str, float]]:
  """The rows of a CSV of numbers (or of its record `path`.gz), parsed to floats ("" is
  NaN), in round order; [] if neither exists."""
  text = read_text(path)
  if text is None:
    return []
  rows = [{k: float(v) if v not in ("", None) else math.nan for k, v in row.items()}
          for row in csv.DictReader(io.StringIO(text))]
  return sorted(rows, key=lambda r: r[ROUND])


def read_metrics(directory: str) -> list[dict[str, float]]:
  """The metrics rows of a run directory or of a record."""
  return read_rows(os.path.join(directory, METRICS_FILE))


def _lock(path: str) -> Optional[int]:
  """A descriptor of `path` (created if missing) under this process's exclusive lock, or
  None when another process holds the lock. If the file was removed or replaced between
  opening and locking (its holder released it), the new one is tried."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      return None
    try:
      current = os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
      current = False
    if current:
      return fd
    os.close(fd)


def holder(run_dir: str) -> Optional[int]:
  """The pid written in `run_dir`'s claim if that process is alive, else None: for
  messages (whether the claim is held is the lock's to say, see `claim`)."""
  try:
    with open(run_dir + ".claim") as f:
      text = f.read().strip()
  except FileNotFoundError:
    return None
  if not text.isdigit():
    return None
  try:
    os.kill(int(text), 0)
  except ProcessLookupError:
    return None
  except PermissionError:  # someone else's process
    pass
  return int(text)


@contextlib.contextmanager
def claim(run_dir: str) -> Iterator[bool]:
  """Claims `run_dir` for this process while the block runs; yields False (and claims
  nothing) when a live process already holds it. The claim is `<run_dir>.claim` under
  an exclusive `flock`, holding this process's pid: the kernel drops the lock when the
  process dies, so a claim left by a crash is free (no pid is trusted: pids are
  reused)."""
  path = run_dir + ".claim"
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fd = _lock(path)
  if fd is None:
    yield False
    return
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    yield True
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)  # under the lock: one that opened it meanwhile sees it replaced
    os.close(fd)
