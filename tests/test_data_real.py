"""Real Fashion-MNIST through TFDS: client files match the base dataset via the manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tff_pflego.data import load_federated_data, sources
from tff_pflego.errors import DatasetNotFoundError, UserError


@pytest.fixture(scope="module")
def fmnist(data_dir):
  return load_federated_data("fashion_mnist", "high", 10, seed=0, data_dir=data_dir)


def test_client_files_hold_exactly_the_manifest_examples(fmnist, data_dir):
  base = sources.load_arrays(sources.get_dataset_spec("fashion_mnist"), data_dir)
  with open(fmnist.manifest_path) as f:
    manifest = json.load(f)
  assert manifest["dataset"] == "fashion_mnist" and len(manifest["clients"]) == 10
  assert sum(c["num_train"] for c in manifest["clients"]) == 60000
  for i in (0, 7):
    for part in ("train", "test"):
      x, y = fmnist.client_arrays(i, part)
      entry = manifest["clients"][i]
      idx = np.array(entry[f"{part}_indices"])
      np.testing.assert_array_equal(x, base[part].images[idx] / np.float32(255.0))
      np.testing.assert_array_equal(
          np.array(entry["classes"])[y], base[part].labels[idx])  # re-indexed labels
  assert fmnist.num_classes.tolist() == [2] * 10


def test_reloading_reuses_the_partition(fmnist, data_dir):
  again = load_federated_data("fashion_mnist", "high", 10, seed=0, data_dir=data_dir)
  assert again.partition.to_json() == fmnist.partition.to_json()


def test_missing_raw_file_names_the_file(tmp_path):
  with pytest.raises(DatasetNotFoundError, match=r"mnist/train-images-idx3-ubyte.gz"):
    load_federated_data("mnist", "high", 5, data_dir=str(tmp_path / "d"),
                        raw_data_dir=str(tmp_path / "nothing"))
  with pytest.raises(UserError, match="unknown dataset"):
    load_federated_data("imagenet", "high", 4, data_dir=str(tmp_path / "d"))
