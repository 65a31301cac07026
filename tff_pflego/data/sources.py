"""The real datasets the project trains on, prepared offline by TFDS builders.

Each `DatasetSpec` says which TFDS builder prepares the dataset, which local folder
holds its raw files (`manual_dir`), which files must be there, the public releases of
those files (their sha256), and the shape of the data. `load` prepares the dataset
(once, into `<data_dir>/tfds`) and returns its splits as numpy arrays together with
their provenance (`tff_pflego.data.provenance`).

A prepared copy is used only while its provenance record names the raw files on disk
now; otherwise it is rebuilt. Each dataset extracts its raw files in a scratch folder
of its own, emptied before and after preparation, so no dataset can read another's
files (MNIST's and Fashion-MNIST's raw files have the same names, and TFDS keys its
extraction cache by file name).

Raw files live outside the repository:
* Fashion-MNIST: Debian package `dataset-fashion-mnist` (/usr/share/datasets/fashion-mnist);
* MNIST, EMNIST-Letters, Omniglot, CIFAR-10 (JPEG copy): `../shared/datasets/<name>`
  beside the repository (override with `--raw_data_dir` or `TFF_PFLEGO_RAW_DATA`).

TFDS (and TensorFlow with it) loads only when a dataset is prepared or read, so that
the binaries check their flags against `DATASETS` before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import pathlib
import shutil
import zipfile
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Protocol

import numpy as np

from tff_pflego import files
from tff_pflego.data import provenance
from tff_pflego.errors import DatasetNotFoundError, UserError

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = str(REPO_ROOT / "data")
DEFAULT_RAW_DATA_DIR = os.environ.get(
    "TFF_PFLEGO_RAW_DATA", str(REPO_ROOT.parent / "shared" / "datasets"))
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"
SCRATCH_DIR = "downloads"  # under <data_dir>/tfds; one subfolder per dataset

_MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


@dataclasses.dataclass(frozen=True)
class Arrays:
  """A dataset split as numpy arrays: uint8 images (N, H, W, C), int64 labels (N,).

  `groups` (Omniglot only) holds each example's alphabet id.
  """
  images: np.ndarray
  labels: np.ndarray
  groups: Optional[np.ndarray] = None


class Preparation(Protocol):
  """How one dataset's raw files become a TFDS builder that serves its splits."""

  def directory(self, tfds_dir: str) -> str:
    """The folder holding the prepared copy (and its provenance record)."""

  def build(self, tfds_dir: str, manual_dir: str, scratch_dir: str) -> None:
    """Prepares the copy from `manual_dir`, extracting only into `scratch_dir`."""

  def builder(self, tfds_dir: str) -> tfds.core.DatasetBuilder:
    """The builder over the prepared copy."""


@dataclasses.dataclass(frozen=True)
class TfdsPreparation:
  """A TFDS builder (registered or the project's) prepared with `download_and_prepare`."""
  make: Callable[[str], tfds.core.DatasetBuilder]

  def directory(self, tfds_dir: str) -> str:
    return self.make(tfds_dir).data_dir

  def build(self, tfds_dir: str, manual_dir: str, scratch_dir: str) -> None:
    import tensorflow_datasets as tfds
    tfds.disable_progress_bar()
    self.make(tfds_dir).download_and_prepare(
        download_dir=scratch_dir,
        download_config=tfds.download.DownloadConfig(
            manual_dir=manual_dir,
            download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))

  def builder(self, tfds_dir: str) -> tfds.core.DatasetBuilder:
    return self.make(tfds_dir)


@dataclasses.dataclass(frozen=True)
class ImageFolderPreparation:
  """A zip of `<split>/<class>/<image>` unpacked for `tfds.folder_dataset.ImageFolder`."""
  zip_name: str
  folder: str
  shape: tuple[int, int, int]

  def directory(self, tfds_dir: str) -> str:
    return os.path.join(tfds_dir, "raw", self.folder)

  def build(self, tfds_dir: str, manual_dir: str, scratch_dir: str) -> None:
    path = os.path.join(manual_dir, self.zip_name)
    try:
      with zipfile.ZipFile(path) as z:
        z.extractall(self.directory(tfds_dir))
    except zipfile.BadZipFile as e:
      raise UserError(f"{path} is not a valid zip: {e}") from e

  def builder(self, tfds_dir: str) -> tfds.core.DatasetBuilder:
    import tensorflow_datasets as tfds
    with files.scratch_tempdir():
      return tfds.folder_dataset.ImageFolder(self.directory(tfds_dir), shape=self.shape)


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the project needs to know about one dataset."""
  name: str
  display_name: str
  num_classes: int
  image_shape: tuple[int, int, int]
  body: str  # key into tff_pflego.models.BODIES
  raw_subdir: Optional[str]  # folder under the raw data dir; None: absolute manual dir
  required_files: tuple[str, ...]
  preparation: Preparation
  splits: tuple[str, ...] = ("train", "test")
  partition: str = "classes"  # "classes" (App. A.2) or "alphabets" (Omniglot)
  num_alphabets: Optional[int] = None  # "alphabets": how many (one client each)
  # Each example is written to its client's file this many times, rotated by 0, 90, ...
  # degrees, with its label (Omniglot: 4, the paper's). A manifest's indices name the
  # unrotated examples, so all rotations of one drawing are on the same side of a split.
  rotations: int = 1
  # sha256 of the public releases of each raw file (besides any TFDS registers).
  releases: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)

  def manual_dir(self, raw_data_dir: str) -> str:
    if self.raw_subdir is None:
      return FASHION_MNIST_DEBIAN_DIR
    return os.path.join(raw_data_dir, self.raw_subdir)

  def known_releases(self) -> dict[str, frozenset[str]]:
    """{raw file name: sha256 values of its known releases}, TFDS's registered ones included."""
    known = {name: set(hashes) for name, hashes in self.releases.items()}
    if isinstance(self.preparation, TfdsPreparation):
      builder_cls = type(self.preparation.make(DEFAULT_DATA_DIR))
      for info in (builder_cls.url_infos or {}).values():
        known.setdefault(info.filename, set()).add(info.checksum)
    return {name: frozenset(hashes) for name, hashes in known.items()}


@dataclasses.dataclass(frozen=True)
class PreparedDataset:
  """A prepared dataset: its builder, provenance record, and (once read) its arrays."""
  spec: DatasetSpec
  builder: tfds.core.DatasetBuilder
  record: Mapping
  arrays: Optional[dict[str, Arrays]] = None

  @property
  def fingerprint(self) -> str:
    """sha256 of the prepared arrays (`provenance.arrays_fingerprint`)."""
    return self.record["dataset_fingerprint"]


def _registered(name: str) -> TfdsPreparation:
  """TFDS's own builder `name`."""
  def make(tfds_dir: str) -> tfds.core.DatasetBuilder:
    import tensorflow_datasets as tfds
    with files.scratch_tempdir():
      return tfds.builder(name, data_dir=tfds_dir)
  return TfdsPreparation(make)


def _project(class_name: str) -> TfdsPreparation:
  """The builder class `class_name` of `tff_pflego.data.builders`."""
  def make(tfds_dir: str) -> tfds.core.DatasetBuilder:
    builders = importlib.import_module("tff_pflego.data.builders")
    with files.scratch_tempdir():
      return getattr(builders, class_name)(data_dir=tfds_dir)
  return TfdsPreparation(make)


# EMNIST-Letters' raw files by split: (images, labels) (read by `builders.EmnistLetters`).
EMNIST_LETTERS_FILES = {
    "train": ("emnist-letters-train-images-idx3-ubyte.gz",
              "emnist-letters-train-labels-idx1-ubyte.gz"),
    "test": ("emnist-letters-test-images-idx3-ubyte.gz",
             "emnist-letters-test-labels-idx1-ubyte.gz"),
}


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in [
        # The Debian package recompressed the upstream files (other gzip headers,
        # the same images); TFDS registers the upstream ones.
        DatasetSpec("fashion_mnist", "Fashion-MNIST", 10, (28, 28, 1), "mlp",
                    None, _MNIST_FILES, _registered("fashion_mnist"), releases={
                        "train-images-idx3-ubyte.gz": frozenset(
                            ["b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"]),
                        "train-labels-idx1-ubyte.gz": frozenset(
                            ["0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056"]),
                        "t10k-images-idx3-ubyte.gz": frozenset(
                            ["cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa"]),
                        "t10k-labels-idx1-ubyte.gz": frozenset(
                            ["8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05"]),
                    }),
        DatasetSpec("mnist", "MNIST", 10, (28, 28, 1), "mlp", "mnist",
                    _MNIST_FILES, _registered("mnist")),
        DatasetSpec("emnist_letters", "EMNIST-Letters", 26, (28, 28, 1), "mlp",
                    "emnist", tuple(f for pair in EMNIST_LETTERS_FILES.values()
                                    for f in pair),
                    _project("EmnistLetters"), releases={
                        "emnist-letters-train-images-idx3-ubyte.gz": frozenset(
                            ["6288f418a917e007bf5fddb823a2dc7a5c6a35031401b93292a539cb12bd881f"]),
                        "emnist-letters-train-labels-idx1-ubyte.gz": frozenset(
                            ["9759af91ea6bccdf07a6040fd085861f2ec88e37f7c3f5760f6feb57106fbe5c"]),
                        "emnist-letters-test-images-idx3-ubyte.gz": frozenset(
                            ["50f0e93d75b99b463e9760b8345866f22587fa2c2fba472730a5ba09c693412d"]),
                        "emnist-letters-test-labels-idx1-ubyte.gz": frozenset(
                            ["924955c31fe7fd809b7303b5c0141282955f4b8390c74cdfd5d80435e0f4b4cb"]),
                    }),
        DatasetSpec("cifar10", "CIFAR-10 (JPEG copy)", 10, (32, 32, 3), "cifar_cnn",
                    "cifar10-jpeg", ("cifar10-jpeg.zip",),
                    ImageFolderPreparation("cifar10-jpeg.zip", "cifar10_jpeg", (32, 32, 3)),
                    releases={"cifar10-jpeg.zip": frozenset(
                        ["1f246f18ee1c4b008b72b11e5d912c2b6a325d41b34a6c0136bab1e640200198"])}),
        DatasetSpec("omniglot", "Omniglot", 1623, (28, 28, 1), "conv4", "omniglot",
                    ("images_background.npz", "images_evaluation.npz",
                     "alphabet_id_ranges.txt"),
                    _project("OmniglotArrays"), splits=("drawings",),
                    partition="alphabets", num_alphabets=50, rotations=4, releases={
                        "images_background.npz": frozenset(
                            ["8bf84167413cd00beacdce3fe582f780ab538d8dbef043a6d688f2527bbce199"]),
                        "images_evaluation.npz": frozenset(
                            ["0b84c7ffd94c4841c0040e529c86a82eaaccb986d8eadad5673f7991b7475276"]),
                        "alphabet_id_ranges.txt": frozenset(
                            ["f28a15a5e9fb9d2db72150300e417e0d50eb343b07b934ba0d06c7a8fc5538bc"]),
                    }),
    ]
}


def get_dataset_spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise UserError(
        f"unknown dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}")
  return DATASETS[name]


def check_raw_files(spec: DatasetSpec, raw_data_dir: str) -> str:
  """Returns the manual dir, or raises naming the first missing raw file."""
  manual_dir = spec.manual_dir(raw_data_dir)
  for name in spec.required_files:
    path = os.path.join(manual_dir, name)
    if not os.path.isfile(path):
      hint = ("install the Debian package dataset-fashion-mnist"
              if spec.raw_subdir is None else
              "set --raw_data_dir to the folder holding the shared datasets")
      raise DatasetNotFoundError(
          f"{spec.display_name}: expected raw file {path} is missing ({hint})")
  return manual_dir


def scratch_dir(spec: DatasetSpec, data_dir: str) -> str:
  """Where `spec` alone extracts its raw files while it is prepared."""
  return os.path.join(data_dir, "tfds", SCRATCH_DIR, spec.name)


def prepare(spec: DatasetSpec, data_dir: str,
            raw_data_dir: str = DEFAULT_RAW_DATA_DIR) -> PreparedDataset:
  """The prepared copy of `spec` in `data_dir`, (re)built unless its record names the
  raw files on disk now. Arrays are attached only when it was (re)built."""
  manual_dir = check_raw_files(spec, raw_data_dir)
  raw_files = provenance.hash_raw_files(manual_dir, spec.required_files)
  tfds_dir = os.path.join(data_dir, "tfds")
  directory = spec.preparation.directory(tfds_dir)
  record = provenance.read_record(directory)
  if record is None or "dataset_fingerprint" not in record:
    if os.path.exists(directory):
      logging.warning("%s: the prepared copy in %s records no provenance (made by an "
                      "earlier version, or interrupted): rebuilding it",
                      spec.display_name, directory)
  elif record.get("raw_files") != raw_files:
    changed = sorted(n for n in raw_files if record.get("raw_files", {}).get(n)
                     != raw_files[n])
    logging.warning("%s: the prepared copy in %s was built from other raw files "
                    "(%s differ from %s): rebuilding it", spec.display_name, directory,
                    ", ".join(changed), manual_dir)
  else:
    return PreparedDataset(spec, spec.preparation.builder(tfds_dir), record)
  return _rebuild(spec, tfds_dir, manual_dir, raw_files)


def load(spec: DatasetSpec, data_dir: str,
         raw_data_dir: str = DEFAULT_RAW_DATA_DIR) -> PreparedDataset:
  """`prepare`, then the arrays, checked against the recorded fingerprint."""
  prepared = prepare(spec, data_dir, raw_data_dir)
  if prepared.arrays is not None:
    return prepared
  try:
    arrays = _read_arrays(spec, prepared.builder)
  except Exception:  # pylint: disable=broad-except  # TFDS raises many kinds here
    arrays = None
  if arrays is not None and _fingerprint(arrays) == prepared.fingerprint:
    return dataclasses.replace(prepared, arrays=arrays)
  logging.warning("%s: the prepared copy in %s does not match its provenance record "
                  "(damaged or incomplete): rebuilding it", spec.display_name,
                  spec.preparation.directory(os.path.join(data_dir, "tfds")))
  return _rebuild(spec, os.path.join(data_dir, "tfds"),
                  spec.manual_dir(raw_data_dir), prepared.record["raw_files"])


def load_arrays(spec: DatasetSpec, data_dir: str,
                raw_data_dir: str = DEFAULT_RAW_DATA_DIR) -> dict[str, Arrays]:
  """The splits of `spec` as arrays (`load`)."""
  return load(spec, data_dir, raw_data_dir).arrays


def _rebuild(spec: DatasetSpec, tfds_dir: str, manual_dir: str,
             raw_files: dict[str, str]) -> PreparedDataset:
  directory = spec.preparation.directory(tfds_dir)
  scratch = os.path.join(tfds_dir, SCRATCH_DIR, spec.name)
  from tensorflow_datasets.core.download.extractor import ExtractError
  for path in (directory, scratch):
    shutil.rmtree(path, ignore_errors=True)
  try:
    spec.preparation.build(tfds_dir, manual_dir, scratch)
  except (ValueError, OSError, EOFError, ExtractError) as e:
    raise UserError(
        f"{spec.display_name}: could not prepare from {manual_dir}: "
        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  builder = spec.preparation.builder(tfds_dir)
  arrays = _read_arrays(spec, builder)
  unknown = provenance.unknown_raw_files(raw_files, spec.known_releases())
  if unknown:
    logging.warning("%s: %s in %s match no known release of the dataset (sha256); "
                    "the run records their hashes", spec.display_name,
                    ", ".join(unknown), manual_dir)
  record = dict(dataset=spec.name, raw_dir=os.path.abspath(manual_dir),
                raw_files=raw_files, raw_files_unknown=unknown,
                dataset_fingerprint=_fingerprint(arrays),
                splits={name: int(len(a.labels)) for name, a in arrays.items()})
  provenance.write_record(directory, record)
  return PreparedDataset(spec, builder, record, arrays)


def _read_arrays(spec: DatasetSpec, builder: tfds.core.DatasetBuilder) -> dict[str, Arrays]:
  group_key = "alphabet" if spec.partition == "alphabets" else None
  return {split: _to_arrays(builder, split, group_key) for split in spec.splits}


def _fingerprint(arrays: Mapping[str, Arrays]) -> str:
  return provenance.arrays_fingerprint(
      {name: dataclasses.asdict(a) for name, a in arrays.items()})


def _to_arrays(builder, split: str, group_key: Optional[str] = None) -> Arrays:
  import tensorflow_datasets as tfds
  data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))
  return Arrays(images=np.asarray(data["image"], np.uint8),
                labels=np.asarray(data["label"], np.int64),
                groups=None if group_key is None else np.asarray(data[group_key]))
