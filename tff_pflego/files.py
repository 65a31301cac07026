"""The project's one JSON writer (and atomic file copy) and its plain-number formatting."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from typing import Any, Iterator

import numpy as np


def plain(value: Any) -> Any:
  """A value as plain JSON/CSV data: ints as int, floats to 6 significant digits,
  arrays as space-separated values; anything else as it is."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value.item()
  if isinstance(value, (bool, int, np.bool_, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    number = float(value)
    return float(f"{number:.6g}") if math.isfinite(number) else number
  if isinstance(value, np.ndarray):
    return " ".join(str(v) for v in value.tolist())
  return value


def write_json(path: str, data: Any, indent: int = 1) -> None:
  """Writes `data` to `path` atomically (a reader sees the old file or the new one)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=indent, default=plain)
    f.write("\n")
  os.replace(tmp, path)


def copy_file(source: str, path: str) -> None:
  """Copies `source` to `path` atomically (a reader sees the old file or the new one)."""
  tmp = path + ".tmp"
  shutil.copyfile(source, tmp)
  os.replace(tmp, path)


@contextlib.contextmanager
def scratch_tempdir() -> Iterator[str]:
  """Runs the block with `tempfile`'s default directory set to a fresh directory that
  is removed afterwards: for library calls that leave temporary files behind. TFDS
  makes an empty `tmp*tfds` directory (`DatasetInfo.initialize_from_bucket`) each time
  a builder is constructed for data not yet prepared, and never removes it.

  `tempfile.tempdir` is process-wide: a thread that makes a temporary file while the
  block runs makes it in the scratch directory too, and may lose it when the block ends.
  The project constructs builders on the main thread while no training runs."""
  scratch = tempfile.mkdtemp(prefix="tff_pflego_scratch_")
  previous = tempfile.tempdir
  tempfile.tempdir = scratch
  try:
    yield scratch
  finally:
    tempfile.tempdir = previous
    shutil.rmtree(scratch, ignore_errors=True)
