"""Federated client datasets: a TFDS builder whose splits are the clients.

`ClientSplits` writes one TFRecord file per client and part (`client00017_train`,
`client00017_test`), holding the client's examples with labels already re-indexed to
0..K_i-1 as one record: all its images as one block of raw uint8 bytes and its labels
as another, so a client's data is read with one record read, one parse and one decode
(a record per example cost 2-2.5x as much: 600 parses a round per client). Each part
is a `tff.simulation.datasets.FilePerUserClientData` over those files (`ClientFiles`),
their paths taken from the TFDS split info: the clients' `tf.data` pipelines open
their own file by client id inside the TFF computation, so a round sends client
ids, not serialized datasets, and the data never passes through Python. The same
reader takes a vector of paths and reads those clients' examples one after another
(cohort evaluation).

Each element of a client dataset is a batch `{"x": float32 [n, H, W, C] in [0, 1],
"y": int32 [n]}` (one per client file read); clients train full-batch (as in the paper)
on all batches concatenated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import tensorflow_federated as tff

from tff_pflego import files
from tff_pflego.data.client_data import ClientDataComputations, client_data_computations
from tff_pflego.data import partition as partition_lib
from tff_pflego.data import provenance, sources
from tff_pflego.data.partition_scheme import (PartitionScheme, check_partition,
                                             read_partition_file)
from tff_pflego.errors import UserError

PARTS = ("train", "test")
# Local labels 0..K_i-1, stored as raw bytes (`make_client_dataset_fn` decodes int32).
LABEL_DTYPE = np.int32


def client_id(index: int) -> str:
  return f"{index:05d}"


def split_name(index_or_id, part: str) -> str:
  cid = index_or_id if isinstance(index_or_id, str) else client_id(index_or_id)
  return f"client{cid}_{part}"


class ClientSplits(tfds.core.GeneratorBasedBuilder):
  """One split per client and part; see the module docstring."""

  # 2.0.0: one record per client file (1.0.0: one per example). A partition's files of
  # another version lie in another directory and are rebuilt (`_verified_manifest`).
  VERSION = tfds.core.Version("2.0.0")
  RELEASE_NOTES = {"2.0.0": "One record per client and part.",
                   "1.0.0": "One record per example."}
  BUILDER_CONFIGS = []

  def __init__(self, *, image_shape: tuple[int, ...],
               partition: partition_lib.ClientPartition | None = None,
               arrays_fn: Callable[[], dict[str, sources.Arrays]] | None = None,
               rotations: int = 1, **kwargs):
    self._image_shape = tuple(image_shape)
    self._partition = partition
    self._arrays_fn = arrays_fn
    self._rotations = rotations
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Personalized federated clients (tff_pflego).",
        disable_shuffling=True,
        # One example per split: the client's examples in the manifest's order.
        features=tfds.features.FeaturesDict({
            "images": tfds.features.Tensor(shape=(None,) + self._image_shape,
                                           dtype=np.uint8,
                                           encoding=tfds.features.Encoding.BYTES),
            "labels": tfds.features.Tensor(shape=(None,), dtype=LABEL_DTYPE,
                                           encoding=tfds.features.Encoding.BYTES),
        }),
    )

  def _split_generators(self, dl_manager):
    if self._partition is None or self._arrays_fn is None:
      raise ValueError("ClientSplits needs a partition and arrays to be prepared")
    arrays = self._arrays_fn()
    p = self._partition
    generators = {}
    for i in range(p.num_clients):
      for part, indices, source in (("train", p.train_indices[i], p.train_source),
                                    ("test", p.test_indices[i], p.test_source)):
        generators[split_name(i, part)] = self._generate_examples(*with_rotations(
            arrays[source].images[indices],
            p.local_labels(i, arrays[source].labels[indices]), self._rotations))
    return generators

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    yield 0, {"images": images, "labels": labels.astype(LABEL_DTYPE)}


def _client_splits(**kwargs) -> ClientSplits:
  """`ClientSplits(**kwargs)`, leaving nothing in the temporary directory
  (`files.scratch_tempdir`)."""
  with files.scratch_tempdir():
    return ClientSplits(**kwargs)


def with_rotations(images: np.ndarray, labels: np.ndarray, rotations: int
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Each (N, H, W, C) image followed by its rotations by 90, 180, ... degrees
  (counterclockwise; `rotations` images in all), each with the image's label."""
  if rotations == 1:
    return images, labels
  rotated = np.stack([np.rot90(images, k, axes=(1, 2)) for k in range(rotations)], axis=1)
  return (rotated.reshape((-1,) + images.shape[1:]), np.repeat(labels, rotations))


@dataclasses.dataclass
class FederatedData:
  """Train and test `ClientData` of one partitioned dataset, plus its bookkeeping."""
  spec: sources.DatasetSpec
  personalization: str
  seed: int
  partition: partition_lib.ClientPartition
  train: "ClientFiles"
  test: "ClientFiles"
  manifest_path: str
  # Part -> every client's file path, by client index (from the TFDS split info).
  client_files: dict[str, np.ndarray]
  # path(s) -> the examples of those client files, in order (`make_client_dataset_fn`).
  read_client_files: Callable[[tf.Tensor], tf.data.Dataset]
  # Raw files' sha256, the prepared dataset's and the partition's fingerprints.
  provenance: dict = dataclasses.field(default_factory=dict)

  @property
  def client_ids(self) -> list[str]:
    return self.train.client_ids

  @property
  def num_clients(self) -> int:
    return self.partition.num_clients

  @property
  def num_train_examples(self) -> np.ndarray:
    return self.num_examples("train")

  def num_examples(self, part: str) -> np.ndarray:
    """N_i of every client's `part` ("train" or "test")."""
    indices = self.partition.train_indices if part == "train" else self.partition.test_indices
    return np.array([len(i) * self.spec.rotations for i in indices], np.int64)

  @property
  def num_classes(self) -> np.ndarray:
    """K_i for every client."""
    return np.array([len(c) for c in self.partition.class_sets], np.int64)

  @property
  def client_data_computations(self) -> ClientDataComputations:
    """client id -> data computations, for processes whose `next` takes client ids."""
    return client_data_computations(self.train, self.test)

  def client_arrays(self, index: int, part: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """One client's full batch as numpy (x, y): for tests and plain-TF baselines."""
    data = self.train if part == "train" else self.test
    batches = list(data.create_tf_dataset_for_client(client_id(index)))
    return (np.concatenate([b["x"].numpy() for b in batches]),
            np.concatenate([b["y"].numpy() for b in batches]))


def make_client_dataset_fn(image_shape: tuple[int, ...]
                           ) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """A tf_fn from a client file path (or a vector of paths, read one after another) to
  its examples as `{x, y}` batches, one per file."""
  image_shape = tuple(image_shape)
  # The builder's features: Tensor features with BYTES encoding (raw bytes), so one
  # decode_raw each serves the whole client (what TFDS's decoder does, without its
  # per-feature dispatch; a test checks equality with the arrays written).
  spec = {"images": tf.io.FixedLenFeature([], tf.string),
          "labels": tf.io.FixedLenFeature([], tf.string)}

  def to_model_inputs(serialized):
    record = tf.io.parse_single_example(serialized, spec)
    images = tf.reshape(tf.io.decode_raw(record["images"], tf.uint8), (-1,) + image_shape)
    # Converted inside the tf.data function: true division, x = u / 255 exactly
    # (outside it, Grappler may rewrite the division into a reciprocal product).
    return {"x": tf.cast(images, tf.float32) / 255.0,
            "y": tf.io.decode_raw(record["labels"], tf.int32)}

  def dataset_fn(paths) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(paths).map(to_model_inputs)

  return dataset_fn


class ClientFiles(tff.simulation.datasets.FilePerUserClientData):
  """`FilePerUserClientData` whose in-graph dataset function (`serializable_dataset_fn`,
  hence `dataset_computation`) finds a client's file from its id alone.

  The library's builds a lookup table of all I ids and paths inside every client
  computation, so every round carries and initializes O(I) constants: at I = 10,000 a
  PFLEGO round took 1.38x its time at I = 100 (docs/benchmark_population.json). When
  every path is prefix + id + suffix (checked here, client by client), the path is
  joined from the id in the graph instead; otherwise the library's table is used.
  """

  def __init__(self, client_ids_to_files: dict[str, str],
               dataset_fn: Callable[[tf.Tensor], tf.data.Dataset]):
    super().__init__(client_ids_to_files, dataset_fn)
    self._path_of_id = None
    some_id, some_path = next(iter(client_ids_to_files.items()))
    cuts = [i for i in range(len(some_path)) if some_path.startswith(some_id, i)]
    for cut in cuts:  # where in the path the id stands
      prefix, suffix = some_path[:cut], some_path[cut + len(some_id):]
      if all(path == f"{prefix}{cid}{suffix}" for cid, path in client_ids_to_files.items()):
        self._path_of_id = lambda cid, p=prefix, s=suffix: tf.strings.join([p, cid, s])
        break

  @property
  def serializable_dataset_fn(self):
    if self._path_of_id is None:
      return super().serializable_dataset_fn
    return lambda client_id: self._dataset_fn(self._path_of_id(client_id))


def client_file_paths(builder: tfds.core.DatasetBuilder, num_clients: int,
                      part: str) -> np.ndarray:
  """Every client's file of `part`, by client index, as the TFDS split info names it."""
  return np.array([os.fspath(builder.info.splits[split_name(i, part)].filepaths[0])
                   for i in range(num_clients)], dtype=object)


def partition_name(dataset: str, personalization: str, num_clients: int, seed: int,
                   scheme: PartitionScheme = PartitionScheme(),
                   file_partition: Optional[partition_lib.ClientPartition] = None) -> str:
  """The directory name of a partition's manifest and client files."""
  if file_partition is not None:
    content = provenance.sha256_json(file_partition.to_json())
    return f"{dataset}_file{content[:16]}"
  if scheme.partition == "dirichlet":
    return f"{dataset}_dirichlet{scheme.dirichlet_alpha:g}_i{num_clients}_s{seed}"
  if scheme.class_assignment == "independent":
    return f"{dataset}_{personalization}_independent_i{num_clients}_s{seed}"
  return f"{dataset}_{personalization}_i{num_clients}_s{seed}"


_TFRECORD_FRAMING_BYTES = 16  # length (8) + length CRC (4) + data CRC (4) per record


def _check_client_files(builder: tfds.core.DatasetBuilder, manifest_path: str) -> None:
  """Every client file exists with the size TFDS recorded (catches truncated files)."""
  for split in builder.info.splits.values():
    for info in split.file_instructions:
      path = info.filename
      expected = None
      if len(split.shard_lengths) == 1:
        expected = int(split.num_bytes) + _TFRECORD_FRAMING_BYTES * split.shard_lengths[0]
      size = os.path.getsize(path) if os.path.exists(path) else None
      if size is None or (expected is not None and size != expected):
        state = "missing" if size is None else f"{size} bytes, expected {expected}"
        raise UserError(f"client file {path} is damaged ({state}); delete "
                        f"{manifest_path} to rebuild the clients")


def load_federated_data(dataset: str, personalization: str, num_clients: int,
                        seed: int = 0, data_dir: str = sources.DEFAULT_DATA_DIR,
                        raw_data_dir: str = sources.DEFAULT_RAW_DATA_DIR,
                        scheme: PartitionScheme = PartitionScheme()) -> FederatedData:
  """Partitions `dataset` into `num_clients` clients (once) and serves them.

  The first call prepares the base dataset through TFDS, partitions it
  (`tff_pflego.data.partition`, as `scheme` says; with `scheme.partition_file`, the
  partition that file holds, checked against the data, and `num_clients` must be its
  client count), writes one TFRecord file per client and part and a
  manifest (`<data_dir>/partitions/<name>/manifest.json`); later calls read both back.
  The manifest names the fingerprint of the prepared data it split, and the client
  files the fingerprint of their manifest (`provenance`): a partition of other data
  than the prepared copy of the raw files on disk now, or one without those records
  (an earlier version's), is rebuilt.
  """
  spec = sources.get_dataset_spec(dataset)
  check_partition(spec, personalization, num_clients, scheme)
  file_manifest = file_partition = None
  if scheme.partition_file is not None:
    file_manifest, file_partition = read_partition_file(scheme.partition_file, dataset)
    if file_partition.num_clients != num_clients:
      raise UserError(f"--partition_file {scheme.partition_file} has "
                      f"{file_partition.num_clients} clients, not {num_clients}")
  name = partition_name(dataset, personalization, num_clients, seed, scheme, file_partition)
  manifest_path = os.path.join(data_dir, "partitions", name, "manifest.json")
  builder_kwargs = dict(image_shape=spec.image_shape, rotations=spec.rotations,
                        data_dir=os.path.join(data_dir, "tfds", "clients", name))
  prepared = sources.prepare(spec, data_dir, raw_data_dir)
  recorded = (file_manifest or {}).get("provenance", {}).get("dataset_fingerprint")
  if recorded not in (None, prepared.fingerprint):
    raise UserError(f"--partition_file {scheme.partition_file} split other data "
                    f"(dataset fingerprint {recorded[:12]}) than the prepared "
                    f"{spec.display_name} ({prepared.fingerprint[:12]})")
  builder = _client_splits(**builder_kwargs)  # what a verified manifest's clients are read by
  manifest = _verified_manifest(manifest_path, prepared.fingerprint, builder.data_dir,
                                spec.rotations)

  if manifest is not None:
    partition = partition_lib.ClientPartition.from_json(manifest)
  else:
    prepared = sources.load(spec, data_dir, raw_data_dir)
    arrays = prepared.arrays
    if file_partition is not None:
      file_partition.check_fits({split: a.labels for split, a in arrays.items()},
                                spec.num_classes)
      partition = file_partition
    elif spec.partition == "alphabets":
      partition = partition_lib.partition_by_alphabet(
          arrays["drawings"].labels, arrays["drawings"].groups, num_clients, seed)
    elif scheme.partition == "dirichlet":
      partition = partition_lib.partition_by_dirichlet(
          arrays["train"].labels, arrays["test"].labels, num_clients,
          scheme.dirichlet_alpha, seed)
    else:
      partition = partition_lib.partition_by_classes(
          arrays["train"].labels, arrays["test"].labels, num_clients,
          partition_lib.classes_per_client(personalization, spec.num_classes), seed,
          scheme.class_assignment)
    shutil.rmtree(os.path.dirname(manifest_path), ignore_errors=True)
    shutil.rmtree(builder_kwargs["data_dir"], ignore_errors=True)
    builder = _client_splits(partition=partition, arrays_fn=lambda: arrays, **builder_kwargs)
    tfds.disable_progress_bar()  # one bar per client split would flood the log
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        compute_stats=tfds.download.ComputeStatsMode.SKIP))
    content = {"dataset": dataset, "personalization": personalization,
               "num_clients": num_clients, "seed": seed, "scheme": scheme.record(spec),
               **({"rotations": spec.rotations} if spec.rotations != 1 else {}),
               **partition.to_json(),
               "provenance": dict(dataset_fingerprint=prepared.fingerprint,
                                  raw_files=prepared.record["raw_files"])}
    manifest = dict(content, partition_fingerprint=provenance.sha256_json(content))
    provenance.write_record(builder.data_dir, dict(
        partition_fingerprint=manifest["partition_fingerprint"]))
    os.makedirs(os.path.dirname(manifest_path), exist_ok=True)
    files.write_json(manifest_path, manifest)

  _check_client_files(builder, manifest_path)
  ids = [client_id(i) for i in range(partition.num_clients)]
  paths = {part: client_file_paths(builder, partition.num_clients, part) for part in PARTS}
  read = make_client_dataset_fn(spec.image_shape)
  train, test = (ClientFiles(dict(zip(ids, paths[part])), read) for part in PARTS)
  data_provenance = dict(
      raw_dir=prepared.record.get("raw_dir"), raw_files=prepared.record["raw_files"],
      raw_files_unknown=prepared.record.get("raw_files_unknown", []),
      dataset_fingerprint=prepared.fingerprint,
      partition_fingerprint=manifest["partition_fingerprint"])
  data_provenance["partition_scheme"] = manifest.get("scheme", scheme.record(spec))
  return FederatedData(spec, personalization, seed, partition, train, test, manifest_path,
                       paths, read, data_provenance)


def _other_versions(client_dir: str) -> list[str]:
  """The other `ClientSplits` versions written beside `client_dir` (its version dir)."""
  parent, version = os.path.split(os.path.normpath(client_dir))
  if not os.path.isdir(parent):
    return []
  return sorted(v for v in os.listdir(parent) if v != version and not v.startswith(".")
                and os.path.isdir(os.path.join(parent, v)))


def _verified_manifest(manifest_path: str, dataset_fingerprint: str,
                       client_dir: str, rotations: int) -> Optional[dict]:
  """The manifest if it and its client files were built from this dataset, else None.

  Says in one line why an existing partition is rebuilt.
  """
  if not os.path.exists(manifest_path):
    return None
  try:
    with open(manifest_path) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    manifest = None
  if not isinstance(manifest, dict) or "partition_fingerprint" not in manifest:
    reason = "records no provenance (made by an earlier version)"
  elif manifest.get("provenance", {}).get("dataset_fingerprint") != dataset_fingerprint:
    reason = "was built from other data than the prepared dataset"
  elif manifest.get("rotations", 1) != rotations:
    reason = (f"holds {manifest.get('rotations', 1)} rotation(s) of each example, "
              f"the dataset {rotations}")
  elif provenance.sha256_json({k: v for k, v in manifest.items()
                               if k != "partition_fingerprint"}) != manifest[
                                   "partition_fingerprint"]:
    reason = "does not match its own fingerprint (edited or damaged)"
  elif (provenance.read_record(client_dir) or {}).get(
      "partition_fingerprint") != manifest["partition_fingerprint"]:
    older = _other_versions(client_dir)
    reason = (f"has client files of another format (ClientSplits {', '.join(older)}; "
              f"this version writes {os.path.basename(client_dir)})" if older else
              f"has client files under {client_dir} from another partition, or none")
  else:
    return manifest
  logging.warning("partition %s %s: rebuilding it", manifest_path, reason)
  return None
