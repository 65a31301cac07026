"""The real datasets the project trains on, prepared offline by TFDS builders.

Each `DatasetSpec` says which TFDS builder prepares the dataset, which local folder
holds its raw files (`manual_dir`), which files must be there, and the shape of the
data. `load_arrays` prepares the builder (once, into `<data_dir>/tfds`) and returns
the train and test splits as numpy arrays.

Raw files live outside the repository:
* Fashion-MNIST: Debian package `dataset-fashion-mnist` (/usr/share/datasets/fashion-mnist);
* MNIST, EMNIST-Letters, Omniglot, CIFAR-10 (JPEG copy): `../shared/datasets/<name>`
  beside the repository (override with `--raw_data_dir` or `TFF_PFLEGO_RAW_DATA`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import zipfile
from typing import Callable, Optional

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download.extractor import ExtractError

from tff_pflego.data import builders
from tff_pflego.errors import DatasetNotFoundError, UserError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = str(REPO_ROOT / "data")
DEFAULT_RAW_DATA_DIR = os.environ.get(
    "TFF_PFLEGO_RAW_DATA", str(REPO_ROOT.parent / "shared" / "datasets"))
FASHION_MNIST_DEBIAN_DIR = "/usr/share/datasets/fashion-mnist"

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
  make_builder: Callable[[str, str], tfds.core.DatasetBuilder]
  partition: str = "classes"  # "classes" (App. A.2) or "alphabets" (Omniglot)

  def manual_dir(self, raw_data_dir: str) -> str:
    if self.raw_subdir is None:
      return FASHION_MNIST_DEBIAN_DIR
    return os.path.join(raw_data_dir, self.raw_subdir)


def _registered_builder(name: str) -> Callable[[str, str], tfds.core.DatasetBuilder]:
  return lambda data_dir, manual_dir: tfds.builder(name, data_dir=data_dir)


def _class_builder(cls) -> Callable[[str, str], tfds.core.DatasetBuilder]:
  return lambda data_dir, manual_dir: cls(data_dir=data_dir)


def _cifar_builder(data_dir: str, manual_dir: str) -> tfds.core.DatasetBuilder:
  """`tfds.folder_dataset.ImageFolder` over the unzipped JPEG copy of CIFAR-10."""
  root = os.path.join(data_dir, "raw", "cifar10_jpeg")
  done = os.path.join(root, ".unzipped")
  if not os.path.exists(done):
    check_raw_files(DATASETS["cifar10"], os.path.dirname(manual_dir))
    shutil.rmtree(root, ignore_errors=True)
    try:
      with zipfile.ZipFile(os.path.join(manual_dir, "cifar10-jpeg.zip")) as z:
        z.extractall(root)
    except zipfile.BadZipFile as e:
      raise UserError(f"{manual_dir}/cifar10-jpeg.zip is not a valid zip: {e}") from e
    pathlib.Path(done).touch()
  return tfds.folder_dataset.ImageFolder(root, shape=(32, 32, 3))


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec for spec in [
        DatasetSpec("fashion_mnist", "Fashion-MNIST", 10, (28, 28, 1), "mlp",
                    None, _MNIST_FILES, _registered_builder("fashion_mnist")),
        DatasetSpec("mnist", "MNIST", 10, (28, 28, 1), "mlp", "mnist",
                    _MNIST_FILES, _registered_builder("mnist")),
        DatasetSpec("emnist_letters", "EMNIST-Letters", 26, (28, 28, 1), "mlp",
                    "emnist", tuple(f for pair in builders.EmnistLetters.FILES.values()
                                    for f in pair),
                    _class_builder(builders.EmnistLetters)),
        DatasetSpec("cifar10", "CIFAR-10 (JPEG copy)", 10, (32, 32, 3), "cifar_cnn",
                    "cifar10-jpeg", ("cifar10-jpeg.zip",), _cifar_builder),
        DatasetSpec("omniglot", "Omniglot", 1623, (28, 28, 1), "conv4", "omniglot",
                    ("images_background.npz", "images_evaluation.npz",
                     "alphabet_id_ranges.txt"),
                    _class_builder(builders.OmniglotArrays), partition="alphabets"),
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


def load_arrays(spec: DatasetSpec, data_dir: str,
                raw_data_dir: str = DEFAULT_RAW_DATA_DIR) -> dict[str, Arrays]:
  """Prepares `spec`'s TFDS builder offline (once) and returns its splits as arrays."""
  tfds_dir = os.path.join(data_dir, "tfds")
  builder = spec.make_builder(tfds_dir, spec.manual_dir(raw_data_dir))
  if not _is_prepared(builder):
    manual_dir = check_raw_files(spec, raw_data_dir)
    config = tfds.download.DownloadConfig(
        manual_dir=manual_dir,
        download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS)
    try:
      tfds.disable_progress_bar()
      builder.download_and_prepare(download_config=config)
    except (ValueError, OSError, EOFError, ExtractError) as e:
      raise UserError(
          f"{spec.display_name}: could not prepare from {manual_dir}: "
          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
  if spec.partition == "alphabets":
    return {"drawings": _to_arrays(builder, "drawings", group_key="alphabet")}
  return {split: _to_arrays(builder, split) for split in ("train", "test")}


def _is_prepared(builder: tfds.core.DatasetBuilder) -> bool:
  if isinstance(builder, tfds.folder_dataset.ImageFolder):
    return True
  return os.path.exists(os.path.join(builder.data_dir, "dataset_info.json"))


def _to_arrays(builder, split: str, group_key: Optional[str] = None) -> Arrays:
  data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1, shuffle_files=False))
  return Arrays(images=np.asarray(data["image"], np.uint8),
                labels=np.asarray(data["label"], np.int64),
                groups=None if group_key is None else np.asarray(data[group_key]))
