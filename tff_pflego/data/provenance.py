"""Provenance of prepared data: what a copy was built from, checked on every load.

Three fingerprints chain a run's data back to the raw files:

* raw files: the sha256 of every raw file a dataset is prepared from;
* dataset: the sha256 of the prepared arrays (every split's images, labels and
  groups), recorded beside the prepared copy together with the raw files' hashes;
* partition: the sha256 of a partition manifest's content, which names the dataset
  fingerprint it split; recorded in the manifest and beside the client files.

A copy whose record is missing (made by an earlier version) or names other inputs
than the ones on disk now is stale: the loaders rebuild it and say so in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable, Mapping, Optional

import numpy as np

from tff_pflego import files

RECORD_FILE = "tff_pflego_provenance.json"
_CHUNK = 1 << 20


def sha256_file(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_CHUNK), b""):
      digest.update(chunk)
  return digest.hexdigest()


def sha256_json(value: Any) -> str:
  """sha256 of `value`'s canonical JSON (sorted keys, no spaces)."""
  text = json.dumps(value, sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def hash_raw_files(directory: str, names: Iterable[str]) -> dict[str, str]:
  """{file name: sha256} of the named files in `directory`."""
  return {name: sha256_file(os.path.join(directory, name)) for name in sorted(names)}


def unknown_raw_files(hashes: Mapping[str, str],
                      known: Mapping[str, frozenset[str]]) -> list[str]:
  """The files whose hash is not one of the releases listed in `known`."""
  return [name for name, digest in hashes.items()
          if name in known and digest not in known[name]]


def arrays_fingerprint(splits: Mapping[str, Mapping[str, Optional[np.ndarray]]]) -> str:
  """sha256 over every split's arrays (name, dtype, shape and bytes), in name order."""
  digest = hashlib.sha256()
  for split in sorted(splits):
    for field in sorted(splits[split]):
      array = splits[split][field]
      if array is None:
        continue
      array = np.ascontiguousarray(array)
      digest.update(f"{split}/{field}/{array.dtype.str}/{array.shape};".encode())
      digest.update(memoryview(array).cast("B"))
  return digest.hexdigest()


def read_record(directory: str) -> Optional[dict]:
  """The provenance record in `directory`, or None if there is none or it is damaged."""
  try:
    with open(os.path.join(directory, RECORD_FILE)) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def write_record(directory: str, record: Mapping[str, Any]) -> None:
  files.write_json(os.path.join(directory, RECORD_FILE), dict(sorted(record.items())))
