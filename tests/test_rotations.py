"""Omniglot's rotations (spec: the four 90-degree rotations of every drawing, same label):
the client files hold each drawing of the manifest followed by its rotations, and the
example counts the algorithms weight by count them."""

import numpy as np
import tensorflow_datasets as tfds

from tff_pflego import files
from tff_pflego.data import federated, partition as partition_lib, sources


def _rotated_by_hand(image: np.ndarray, quarter_turns: int) -> np.ndarray:
  """Counterclockwise by 90 degrees `quarter_turns` times, index by index."""
  for _ in range(quarter_turns):
    h, w = image.shape[:2]
    turned = np.empty((w, h) + image.shape[2:], image.dtype)
    for i in range(w):
      for j in range(h):
        turned[i, j] = image[j, w - 1 - i]
    image = turned
  return image


def test_omniglot_is_declared_with_the_papers_four_rotations():
  assert sources.get_dataset_spec("omniglot").rotations == 4
  assert all(sources.get_dataset_spec(name).rotations == 1
             for name in ("mnist", "fashion_mnist", "emnist_letters", "cifar10"))


def test_client_files_hold_every_drawing_followed_by_its_rotations(tmp_path):
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (7, 5, 5, 1), dtype=np.uint8)
  labels = np.array([3, 3, 8, 8, 3, 8, 3], np.int64)
  split = partition_lib.ClientPartition(
      [np.array([3, 8]), np.array([3])], [np.array([0, 2, 5]), np.array([1, 6])],
      [np.array([3]), np.array([4])], train_source="drawings", test_source="drawings")
  with files.scratch_tempdir():  # TFDS leaves a tmp*tfds directory per new builder
    builder = federated.ClientSplits(
        image_shape=(5, 5, 1), partition=split, rotations=4, data_dir=str(tmp_path),
        arrays_fn=lambda: {"drawings": sources.Arrays(images, labels)})
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      compute_stats=tfds.download.ComputeStatsMode.SKIP))
  read = federated.make_client_dataset_fn((5, 5, 1))
  for client in range(2):
    for part, indices in (("train", split.train_indices[client]),
                          ("test", split.test_indices[client])):
      path = federated.client_file_paths(builder, 2, part)[client]
      got = list(read(path))
      x = np.concatenate([b["x"].numpy() for b in got])
      y = np.concatenate([b["y"].numpy() for b in got])
      assert len(y) == 4 * len(indices)
      for n, drawing in enumerate(indices):
        for k in range(4):
          np.testing.assert_array_equal(
              x[4 * n + k], _rotated_by_hand(images[drawing], k).astype(np.float32) / 255)
          assert y[4 * n + k] == split.local_labels(client, labels[drawing:drawing + 1])[0]


def test_example_counts_include_the_rotations():
  spec = sources.get_dataset_spec("omniglot")
  split = partition_lib.ClientPartition([np.array([0])], [np.arange(15)], [np.arange(5)])
  data = federated.FederatedData(spec, "high", 0, split, None, None, "", {}, None)
  np.testing.assert_array_equal(data.num_examples("train"), [60])
  np.testing.assert_array_equal(data.num_examples("test"), [20])


def test_a_partition_written_without_the_rotations_is_rebuilt(tmp_path, caplog):
  from tff_pflego.data import provenance
  from tff_pflego import files
  content = {"dataset": "omniglot", "provenance": {"dataset_fingerprint": "d"}}
  manifest = dict(content, partition_fingerprint=provenance.sha256_json(content))
  path = str(tmp_path / "manifest.json")
  files.write_json(path, manifest)
  provenance.write_record(str(tmp_path), {"partition_fingerprint":
                                          manifest["partition_fingerprint"]})
  assert federated._verified_manifest(path, "d", str(tmp_path), 1) == manifest
  assert federated._verified_manifest(path, "d", str(tmp_path), 4) is None
  assert "holds 1 rotation(s) of each example, the dataset 4" in caplog.text
