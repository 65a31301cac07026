"""Prepared data and partitions are what their raw files say, or they are rebuilt.

The real-data tests compare every prepared split with its raw IDX files read here by
a reader of the test's own, image for image and label for label. The mechanism tests
run on a tiny dataset of synthetic IDX files (same builder as EMNIST-Letters), so each
stale, foreign, damaged or legacy copy takes a second to build.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import logging
import os
import struct

import numpy as np
import pytest

from tests import helpers
from tff_pflego.data import builders, federated, load_federated_data, provenance, sources

MNIST_RAW_NAMES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                   "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def read_idx_gz(path: str) -> np.ndarray:
  """The test's own IDX reader: magic 0x0000080D (D dims), big-endian sizes, bytes."""
  with gzip.open(path, "rb") as f:
    data = f.read()
  ndim = data[3]
  dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def sorted_examples(images: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """Each (image, label) pair as one byte row, rows sorted: the split as a multiset."""
  rows = np.concatenate([images.reshape(len(images), -1).astype(np.uint8),
                         labels.astype(np.uint8)[:, None]], axis=1)
  return np.sort(np.ascontiguousarray(rows).view(np.dtype((np.void, rows.shape[1]))).ravel())


def assert_matches_raw(arrays: dict[str, sources.Arrays], raw_dir: str) -> None:
  """Every split holds the raw files' (image, label) pairs, each exactly once.

  TFDS shuffles examples when it writes a split, so the order is not the raw order.
  """
  for split, (images, labels) in MNIST_RAW_NAMES.items():
    raw = sorted_examples(read_idx_gz(os.path.join(raw_dir, images)),
                          read_idx_gz(os.path.join(raw_dir, labels)))
    prepared = sorted_examples(arrays[split].images[..., 0], arrays[split].labels)
    assert len(prepared) == len(raw), split
    assert np.array_equal(prepared, raw), f"{split} differs from {raw_dir}"


def test_datasets_with_same_raw_file_names_never_read_each_others_files(data_dir):
  """Fashion-MNIST, then MNIST in the same data dir (the raw files share their names)."""
  fashion = sources.get_dataset_spec("fashion_mnist")
  mnist = sources.get_dataset_spec("mnist")
  fashion_arrays = sources.load_arrays(fashion, data_dir)
  mnist_arrays = sources.load_arrays(mnist, data_dir)
  assert_matches_raw(fashion_arrays, sources.FASHION_MNIST_DEBIAN_DIR)
  assert_matches_raw(mnist_arrays, mnist.manual_dir(sources.DEFAULT_RAW_DATA_DIR))


def test_every_pair_of_datasets_prepares_and_extracts_in_disjoint_folders(tmp_path):
  tfds_dir = str(tmp_path / "tfds")
  folders = {name: (spec.preparation.directory(tfds_dir),
                    sources.scratch_dir(spec, str(tmp_path)))
             for name, spec in sources.DATASETS.items()}
  for (a, fa), (b, fb) in itertools.combinations(folders.items(), 2):
    for x, y in itertools.product(fa, fb):
      assert os.path.commonpath([x, y]) not in (x, y), (a, b, x, y)


def test_a_foreign_prepared_mnist_and_its_partition_are_rebuilt(tmp_path, caplog):
  """What earlier versions left behind: 'MNIST' prepared from Fashion-MNIST's files."""
  data_dir = str(tmp_path / "data")
  foreign_raw = tmp_path / "foreign"
  foreign_raw.mkdir()
  os.symlink(sources.FASHION_MNIST_DEBIAN_DIR, foreign_raw / "mnist")
  wrong = load_federated_data("mnist", "high", 5, data_dir=data_dir,
                              raw_data_dir=str(foreign_raw))
  assert sorted(wrong.provenance["raw_files_unknown"]) == sorted(
      itertools.chain(*MNIST_RAW_NAMES.values()))  # no MNIST release has these hashes

  with caplog.at_level(logging.WARNING):
    data = load_federated_data("mnist", "high", 5, data_dir=data_dir)
  messages = " | ".join(r.getMessage() for r in caplog.records)
  assert "MNIST: the prepared copy" in messages and "built from other raw files" in messages
  assert "was built from other data than the prepared dataset: rebuilding" in messages
  assert data.provenance["raw_files_unknown"] == []
  assert data.provenance["dataset_fingerprint"] != wrong.provenance["dataset_fingerprint"]
  raw_dir = sources.get_dataset_spec("mnist").manual_dir(sources.DEFAULT_RAW_DATA_DIR)
  arrays = sources.load_arrays(sources.get_dataset_spec("mnist"), data_dir)
  assert_matches_raw(arrays, raw_dir)
  for client in range(5):  # the client files hold the rebuilt (real) MNIST examples
    x, _ = data.client_arrays(client)
    indices = data.partition.train_indices[client]
    np.testing.assert_array_equal(x, arrays["train"].images[indices] / np.float32(255.0))


# ---- mechanism tests on a tiny dataset -------------------------------------------

@pytest.fixture
def tiny(tmp_path, monkeypatch):
  """A 4-class dataset of synthetic IDX files, registered as `tiny`."""
  return helpers.register_tiny_dataset(str(tmp_path), monkeypatch)


def _load(tiny, **kwargs):
  return load_federated_data("tiny", "high", 2, data_dir=tiny["data_dir"],
                             raw_data_dir=tiny["raw_dir"], **kwargs)


def _warnings(caplog) -> str:
  return " | ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_a_reload_reuses_both_copies_silently(tiny, caplog):
  first = _load(tiny)
  with caplog.at_level(logging.WARNING):
    again = _load(tiny)
  assert _warnings(caplog) == ""
  assert again.provenance == first.provenance
  assert first.provenance["raw_files"] == {
      name: provenance.sha256_file(os.path.join(tiny["raw_dir"], "tiny", name))
      for name in tiny["spec"].required_files}


def test_changed_raw_files_rebuild_the_dataset_and_the_partition(tiny, caplog):
  first = _load(tiny)
  images = builders.EmnistLetters.FILES["train"][0]
  path = os.path.join(tiny["raw_dir"], "tiny", images)
  new_images = np.full((64, 28, 28), 7)
  helpers.write_idx_gz(path, new_images)
  with caplog.at_level(logging.WARNING):
    second = _load(tiny)
  assert f"({images} differ from" in _warnings(caplog)
  assert "other data than the prepared dataset: rebuilding" in _warnings(caplog)
  assert second.provenance["dataset_fingerprint"] != first.provenance["dataset_fingerprint"]
  x, _ = second.client_arrays(0)
  np.testing.assert_array_equal(x, np.float32(7 / 255.0))


def test_copies_without_provenance_from_earlier_versions_are_rebuilt(tiny, caplog):
  first = _load(tiny)
  directory = tiny["spec"].preparation.directory(os.path.join(tiny["data_dir"], "tfds"))
  os.remove(os.path.join(directory, provenance.RECORD_FILE))
  with open(first.manifest_path) as f:
    manifest = json.load(f)
  for key in ("provenance", "partition_fingerprint"):
    del manifest[key]
  with open(first.manifest_path, "w") as f:
    json.dump(manifest, f)
  with caplog.at_level(logging.WARNING):
    second = _load(tiny)
  assert "Tiny: the prepared copy" in _warnings(caplog)
  assert "records no provenance (made by an earlier version)" in _warnings(caplog)
  assert f"partition {first.manifest_path} records no provenance" in _warnings(caplog)
  assert second.provenance == first.provenance  # same raw files: the same data again


def test_a_damaged_prepared_copy_is_rebuilt_when_read(tiny, caplog):
  spec, data_dir = tiny["spec"], tiny["data_dir"]
  good = sources.load(spec, data_dir, tiny["raw_dir"])
  directory = spec.preparation.directory(os.path.join(data_dir, "tfds"))
  record = provenance.read_record(directory)
  provenance.write_record(directory, dict(record, dataset_fingerprint="0" * 64))
  with caplog.at_level(logging.WARNING):
    again = sources.load(spec, data_dir, tiny["raw_dir"])
  assert "does not match its provenance record" in _warnings(caplog)
  assert again.fingerprint == good.fingerprint
  np.testing.assert_array_equal(again.arrays["train"].images, good.arrays["train"].images)


@pytest.mark.parametrize("damage", ["edited manifest", "foreign client files"])
def test_a_partition_that_does_not_match_its_records_is_rebuilt(tiny, caplog, damage):
  first = _load(tiny)
  if damage == "edited manifest":
    with open(first.manifest_path) as f:
      manifest = json.load(f)
    manifest["clients"][0]["train_indices"][0] = manifest["clients"][1]["train_indices"][0]
    with open(first.manifest_path, "w") as f:
      json.dump(manifest, f)
    expected = "does not match its own fingerprint"
  else:
    clients_root = os.path.join(tiny["data_dir"], "tfds", "clients",
                                federated.partition_name("tiny", "high", 2, 0))
    [client_dir] = [root for root, _, files in os.walk(clients_root)
                    if provenance.RECORD_FILE in files]
    provenance.write_record(client_dir, {"partition_fingerprint": "f" * 64})
    expected = "from another partition"
  with caplog.at_level(logging.WARNING):
    second = _load(tiny)
  assert expected in _warnings(caplog)
  assert second.provenance == first.provenance
  for part in ("train", "test"):
    np.testing.assert_array_equal(second.client_arrays(0, part)[0],
                                  first.client_arrays(0, part)[0])


def test_raw_files_of_no_known_release_are_named(tiny, caplog):
  spec = dataclasses.replace(tiny["spec"], releases={
      name: frozenset(["0" * 64]) for name in tiny["spec"].required_files})
  with caplog.at_level(logging.WARNING):
    prepared = sources.prepare(spec, tiny["data_dir"], tiny["raw_dir"])
  assert sorted(prepared.record["raw_files_unknown"]) == sorted(spec.required_files)
  assert "match no known release" in _warnings(caplog)


def test_known_releases_include_tfds_registered_checksums_and_shared_sums():
  mnist = sources.get_dataset_spec("mnist").known_releases()
  shared = os.path.join(sources.DEFAULT_RAW_DATA_DIR, "SHA256SUMS")
  with open(shared) as f:
    listed = dict(reversed(line.split()) for line in f if line.strip())
  for name in sources.get_dataset_spec("mnist").required_files:
    assert listed[f"./mnist/{name}"] in mnist[name]
  for dataset in ("emnist_letters", "cifar10", "omniglot"):
    spec = sources.get_dataset_spec(dataset)
    for name in spec.required_files:
      assert listed[f"./{spec.raw_subdir}/{name}"] in spec.known_releases()[name]
  fashion = sources.get_dataset_spec("fashion_mnist")
  for name in fashion.required_files:
    digest = provenance.sha256_file(os.path.join(sources.FASHION_MNIST_DEBIAN_DIR, name))
    assert digest in fashion.known_releases()[name]


def test_client_files_of_the_former_format_are_rebuilt(tmp_path, caplog):
  # Version 1.0.0 wrote one record per example; a partition with only those files is
  # rebuilt (and says why), one with this version's files is kept.
  from tff_pflego import files
  content = {"dataset": "mnist", "provenance": {"dataset_fingerprint": "d"}}
  manifest = dict(content, partition_fingerprint=provenance.sha256_json(content))
  path = str(tmp_path / "manifest.json")
  files.write_json(path, manifest)
  splits = tmp_path / "client_splits"
  old, new = str(splits / "1.0.0"), str(splits / str(federated.ClientSplits.VERSION))
  os.makedirs(old)
  provenance.write_record(old, {"partition_fingerprint": manifest["partition_fingerprint"]})
  with caplog.at_level(logging.WARNING):
    assert federated._verified_manifest(path, "d", new, 1) is None
  assert "has client files of another format (ClientSplits 1.0.0" in _warnings(caplog)
  os.makedirs(new)
  provenance.write_record(new, {"partition_fingerprint": manifest["partition_fingerprint"]})
  assert federated._verified_manifest(path, "d", new, 1) == manifest
