"""The unified framework's real-data devices (spec UNIFIED.md 4.3), from the project's
TFDS-prepared datasets.

M devices; device m draws c distinct classes uniformly without replacement (not with
replacement: defect B6), then takes its training examples from the train split and
its test examples from the test split (not from the train split: B6), split as evenly
as possible over its classes. Training examples are disjoint across devices (each
class's examples are shuffled once and dealt out in turn); test examples are distinct
within a device but may recur on another device holding the class (a test split holds
~1000 examples a class, and 20 devices x 300 can ask for more). Features are the flattened pixels
(CIFAR-10: grey 1024 by ITU-R 601 luma, or colour 3072), each column standardized
with the mean and standard deviation of all devices' training examples (a constant
column is only centred), then every row scaled to unit L2 norm, so a softmax-with-bias
example has |[x; 1]|^2 / 2 = 1 = L' exactly. Labels keep the dataset's class ids.
"""

from __future__ import annotations

import dataclasses
import numpy as np

from tff_pflego.data import sources
from tff_pflego.errors import UserError
from tff_pflego.unified.objectives import DeviceData
from tff_pflego.unified.run_config import REAL
_LUMA = np.array([0.299, 0.587, 0.114])


@dataclasses.dataclass(frozen=True)
class RealSplit:
  data: DeviceData
  classes: np.ndarray  # [M, c] each device's classes
  num_classes: int
  provenance: dict


def _features(images: np.ndarray, colour: bool) -> np.ndarray:
  x = images.astype(np.float64) / 255.0
  if x.shape[-1] == 3 and not colour:
    x = x @ _LUMA
  return x.reshape(len(x), -1)


def _deal(labels: np.ndarray, classes: np.ndarray, per_device: int,
          rng: np.random.Generator, split: str, name: str, disjoint: bool
          ) -> list[np.ndarray]:
  """Each device's example indices: per_device split evenly over its classes, without
  replacement within the device; with `disjoint` also across devices (each class's
  examples shuffled once and dealt out in turn)."""
  by_class = {k: np.flatnonzero(labels == k) for k in np.unique(labels)}
  pools = {k: list(rng.permutation(v)) for k, v in by_class.items()}
  chosen = []
  for device_classes in classes:
    counts = np.full(len(device_classes), per_device // len(device_classes))
    counts[:per_device % len(device_classes)] += 1
    indices = []
    for k, count in zip(device_classes, counts):
      available = pools[k] if disjoint else by_class[k]
      if len(available) < count:
        raise UserError(f"{name}: class {k} has too few {split} examples for "
                        f"{len(classes)} devices with {per_device} examples each")
      if disjoint:
        indices.extend(available[:count])
        del available[:count]
      else:
        indices.extend(rng.choice(available, count, replace=False))
    chosen.append(np.array(indices))
  return chosen


def load(name: str, classes_per_device: int, num_devices: int = 20,
         train_per_device: int = 100, test_per_device: int = 300, seed: int = 0,
         colour: bool = False, data_dir: str = sources.DEFAULT_DATA_DIR,
         raw_data_dir: str = sources.DEFAULT_RAW_DATA_DIR) -> RealSplit:
  if name not in REAL:
    raise UserError(f"--dataset must be one of {', '.join(REAL)} or a synthetic problem, "
                    f"got {name!r}")
  spec = sources.get_dataset_spec(name)
  if not 1 <= classes_per_device <= spec.num_classes:
    raise UserError(f"--classes_per_device must be in [1, {spec.num_classes}] for "
                    f"{name}, got {classes_per_device}")
  prepared = sources.load(spec, data_dir, raw_data_dir)
  train, test = prepared.arrays["train"], prepared.arrays["test"]
  rng = np.random.default_rng(seed)
  classes = np.stack([np.sort(rng.choice(spec.num_classes, classes_per_device,
                                         replace=False)) for _ in range(num_devices)])
  train_idx = _deal(train.labels, classes, train_per_device, rng, "train", name, True)
  test_idx = _deal(test.labels, classes, test_per_device, rng, "test", name, False)
  x_train = np.stack([_features(train.images[i], colour) for i in train_idx])
  x_test = np.stack([_features(test.images[i], colour) for i in test_idx])
  pooled = x_train.reshape(-1, x_train.shape[-1])
  mean, std = pooled.mean(0), pooled.std(0)
  std = np.where(std > 0, std, 1.0)

  def normalize(x):
    x = (x - mean) / std
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)

  data = DeviceData(normalize(x_train), np.stack([train.labels[i] for i in train_idx]
                                                 ).astype(np.int32),
                    normalize(x_test), np.stack([test.labels[i] for i in test_idx]
                                                ).astype(np.int32))
  record = dict(dataset=name, dataset_fingerprint=prepared.fingerprint,
                classes_per_device=classes_per_device, num_devices=num_devices,
                train_per_device=train_per_device, test_per_device=test_per_device,
                seed=seed, colour=colour, device_classes=classes.tolist())
  return RealSplit(data, classes, spec.num_classes, record)


def paper_objective_options(kind: str, classes_per_device: int) -> dict:
  """Spec 4.3: MT2 alpha = 1, lam = 1/c; MX2 lam = 1/c; APFL2 lam = 1, a = 0.05 c."""
  c = classes_per_device
  if kind == "mt2":
    return dict(alpha=1.0, penalty=1.0 / c)
  if kind == "mx2":
    return dict(penalty=1.0 / c)
  if kind == "apfl2":
    return dict(penalty=1.0, mixture=0.05 * c)
  return {}


def local_accuracy(objective, data: DeviceData):
  """(w, betas) -> mean over devices (unweighted) of the test accuracy of the local model
  beta_m alone, as the paper scores every objective (`fl`: the global model s w); the
  test data are converted once and every device is scored in one call."""
  import tensorflow as tf
  test_x, test_y = tf.constant(data.test_x), tf.constant(data.test_y)

  @tf.function
  def accuracy(models):
    predicted = tf.map_fn(lambda m: objective.predict_local(models[m], test_x[m]),
                          tf.range(tf.shape(test_x)[0]), fn_output_signature=tf.int32)
    correct = tf.cast(tf.equal(predicted, test_y), tf.float64)
    return tf.reduce_mean(tf.reduce_mean(correct, axis=1))

  def score(w: np.ndarray, betas: np.ndarray) -> float:
    if objective.local_dim == objective.model_dim:
      models = betas
    else:
      models = np.tile(objective.scale * w, (data.num_devices, 1))
    return float(accuracy(tf.constant(models)))
  return score
