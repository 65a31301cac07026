"""Bodies phi(x; theta): all layers but the last (paper, Table 4).

* `mlp` (MNIST, Fashion-MNIST, EMNIST): Flatten -> Dense 200 ReLU; M = 200.
* `cifar_cnn` (CIFAR-10): 2 x [Conv 64 5x5 ReLU, MaxPool 3x3 stride 2] ->
  Flatten -> Dense 384 ReLU -> Dense 192 ReLU; M = 192.
* `conv4` (Omniglot 28x28): 4 x [Conv 64 3x3 ReLU, MaxPool 2x2] -> Flatten; M = 64.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

L = tf.keras.layers


def mlp_body(input_shape) -> tf.keras.Model:
  return tf.keras.Sequential(
      [L.InputLayer(input_shape), L.Flatten(), L.Dense(200, activation="relu")],
      name="mlp_body")


def cifar_cnn_body(input_shape) -> tf.keras.Model:
  layers = [L.InputLayer(input_shape)]
  for _ in range(2):
    layers += [L.Conv2D(64, 5, padding="same", activation="relu"),
               L.MaxPool2D(pool_size=3, strides=2, padding="same")]
  layers += [L.Flatten(), L.Dense(384, activation="relu"), L.Dense(192, activation="relu")]
  return tf.keras.Sequential(layers, name="cifar_cnn_body")


def conv4_body(input_shape) -> tf.keras.Model:
  layers = [L.InputLayer(input_shape)]
  for _ in range(4):
    layers += [L.Conv2D(64, 3, padding="same", activation="relu"), L.MaxPool2D(2)]
  layers += [L.Flatten()]
  return tf.keras.Sequential(layers, name="conv4_body")


BODIES: dict[str, Callable[[tuple], tf.keras.Model]] = {
    "mlp": mlp_body, "cifar_cnn": cifar_cnn_body, "conv4": conv4_body}


def build_body(name: str, input_shape: tuple, seed: int | None = None) -> tf.keras.Model:
  """Builds body `name`; with `seed`, its initial weights are deterministic."""
  if seed is not None:
    tf.keras.utils.set_random_seed(seed)
  return BODIES[name](tuple(input_shape))


def feature_dim(body: tf.keras.Model) -> int:
  """M, the size of the body's output features."""
  return int(body.output_shape[-1])
