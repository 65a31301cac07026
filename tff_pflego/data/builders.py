"""TFDS builders for the real datasets TFDS cannot prepare from our offline copies.

* `EmnistLetters`: the full EMNIST Letters release (124,800 / 20,800 examples). TFDS's
  own `emnist/letters` config hard-codes the older 88,800 / 14,800 release, so it
  would silently drop a third of the data.
* `OmniglotArrays`: Omniglot from the pixel-exact boolean arrays
  (`images_background.npz`, `images_evaluation.npz`) plus `alphabet_id_ranges.txt`,
  downsampled to 28x28 grey as in the paper.

Both read from `manual_dir` (`tfds.download.DownloadConfig(manual_dir=...)`) and never
download anything.
"""

from __future__ import annotations

import gzip
import os
import re
from typing import Iterator

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from tff_pflego.data import sources


def read_idx(path: str) -> np.ndarray:
  """Reads an IDX (MNIST-format) file, gzipped or not, into a numpy array."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
    raise ValueError(f"{path} is not an unsigned-byte IDX file")
  ndim = data[3]
  dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
  offset = 4 + 4 * ndim
  expected = int(np.prod(dims))
  if len(data) - offset != expected:
    raise ValueError(
        f"{path} is truncated or corrupt: header says {expected} bytes of data, "
        f"file has {len(data) - offset}")
  return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


class EmnistLetters(tfds.core.GeneratorBasedBuilder):
  """EMNIST Letters (26 classes), full release, images upright (transposed)."""

  VERSION = tfds.core.Version("1.0.0")
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Place emnist-letters-{train,test}-{images-idx3,labels-idx1}-ubyte.gz in "
      "manual_dir.")
  FILES = sources.EMNIST_LETTERS_FILES

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="EMNIST Letters: 26 classes (a-z), labels 0..25.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(28, 28, 1)),
            "label": tfds.features.ClassLabel(num_classes=26),
        }),
        supervised_keys=("image", "label"),
    )

  def _split_generators(self, dl_manager):
    return {
        split: self._generate_examples(
            os.path.join(dl_manager.manual_dir, images),
            os.path.join(dl_manager.manual_dir, labels))
        for split, (images, labels) in self.FILES.items()
    }

  def _generate_examples(self, images_path: str, labels_path: str) -> Iterator:
    images = read_idx(images_path)
    labels = read_idx(labels_path).astype(np.int64) - 1  # raw labels are 1..26
    if len(images) != len(labels):
      raise ValueError(f"{images_path} and {labels_path} differ in length")
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {"image": image.T[..., None], "label": label}


def parse_alphabet_ranges(path: str) -> list[tuple[str, int, int]]:
  """Parses `alphabet_id_ranges.txt` into (alphabet, first_id, last_id), 1-based ids.

  Lines look like `0001-0026 Arcadian; 0027-0067 Armenian; ...`; `#` starts a comment.
  """
  with open(path) as f:
    text = " ".join(line.split("#")[0] for line in f)
  text = re.sub(r"\b(background|evaluation):", " ", text)
  ranges = [(name.strip(), int(lo), int(hi)) for lo, hi, name in
            re.findall(r"(\d{4})-(\d{4})\s+([^;\d]+?)\s*(?=;|\d{4}-|$)", text)]
  if not ranges:
    raise ValueError(f"{path} holds no alphabet id ranges")
  return ranges


class OmniglotArrays(tfds.core.GeneratorBasedBuilder):
  """Omniglot, all 1623 characters x 20 drawings, 28x28 grey, with alphabet ids."""

  VERSION = tfds.core.Version("1.0.0")
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Place images_background.npz, images_evaluation.npz and "
      "alphabet_id_ranges.txt in manual_dir.")
  IMAGE_SIZE = 28

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description="Omniglot; ink is white (255) on black, 28x28.",
        features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(28, 28, 1)),
            "label": tf.int64,  # global character id 0..1622
            "alphabet": tf.int64,  # alphabet id 0..49
            "drawing": tf.int64,  # drawing index 0..19
        }),
    )

  def _split_generators(self, dl_manager):
    return {"drawings": self._generate_examples(dl_manager.manual_dir)}

  def _generate_examples(self, manual_dir: str) -> Iterator:
    character_alphabet = _character_to_alphabet(
        os.path.join(manual_dir, "alphabet_id_ranges.txt"))
    character = 0
    for part in ("images_background.npz", "images_evaluation.npz"):
      with np.load(os.path.join(manual_dir, part)) as arrays:
        images = arrays["images"]
      for drawings in images:
        ink = (~drawings.astype(bool)).astype(np.float32)[..., None]
        small = tf.image.resize(ink, (self.IMAGE_SIZE, self.IMAGE_SIZE),
                                method="area").numpy()
        small = np.round(small * 255).astype(np.uint8)
        for d in range(small.shape[0]):
          yield f"{character}_{d}", {
              "image": small[d], "label": character,
              "alphabet": character_alphabet[character], "drawing": d}
        character += 1


def _character_to_alphabet(path: str) -> dict[int, int]:
  """Maps global character ids to alphabet ids, from alphabet_id_ranges.txt."""
  ranges = parse_alphabet_ranges(path)
  mapping: dict[int, int] = {}
  for alphabet_id, (_, lo, hi) in enumerate(ranges):
    for character in range(lo, hi + 1):
      mapping[character - 1] = alphabet_id
  return mapping
