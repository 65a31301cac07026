"""Bodies phi(x; theta): all layers but the last (paper, Table 4).

* `mlp` (MNIST, Fashion-MNIST, EMNIST): Flatten -> Dense 200 ReLU; M = 200.
* `cifar_cnn` (CIFAR-10): 2 x [Conv 64 5x5 ReLU, MaxPool 3x3 stride 2] ->
  Flatten -> Dense 384 ReLU -> Dense 192 ReLU; M = 192.
* `conv4` (Omniglot 28x28): 4 x [Conv 64 3x3 ReLU, MaxPool 2x2] -> Flatten; M = 64.
"""

from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf

# Initialization: U(+-1/sqrt(fan_in)) for kernels and biases (`torch_default_init`,
# PyTorch's default). The paper's reference code is JAX stax (Glorot-normal kernels,
# N(0, 0.01^2) Dense biases), whose kernels are ~2x larger for the MLP. Measured on
# Fashion-MNIST High-Pers (README, "Head steps and initialization"): both reach the
# same accuracy (0.968 with this init and monotone GD, 0.967 with stax's and plain GD).
# This init is kept because every figure the project reports was measured with it.


def torch_default_init(fan_in: int) -> dict:
  """Keras kwargs giving a layer PyTorch's default init, U(+-1/sqrt(fan_in)).

  VarianceScaling(1/3, fan_in, uniform) draws U(+-sqrt(3 * (1/3) / fan_in)).
  """
  limit = fan_in ** -0.5
  return dict(
      kernel_initializer=tf.keras.initializers.VarianceScaling(
          scale=1.0 / 3.0, mode="fan_in", distribution="uniform"),
      bias_initializer=tf.keras.initializers.RandomUniform(-limit, limit))


def zeros_init(fan_in: int) -> dict:
  """Keras kwargs starting a layer at zero: for a body whose weights are assigned
  before any use. Inside a TFF computation every call runs its variables'
  initializers; drawing U(+-1/sqrt(fan_in)) for the MLP's 157k weights at each client
  call was ~5% of a PFLEGO round (docs/round_profile.md, "Third pass")."""
  del fan_in
  return dict(kernel_initializer="zeros", bias_initializer="zeros")


InitFn = Callable[[int], dict]


def _dense(units: int, fan_in: int, init: InitFn, **kwargs) -> tf.keras.layers.Dense:
  return tf.keras.layers.Dense(units, **init(fan_in), **kwargs)


def _conv(filters: int, size: int, channels_in: int, init: InitFn,
          **kwargs) -> tf.keras.layers.Conv2D:
  return tf.keras.layers.Conv2D(filters, size, **init(size * size * channels_in), **kwargs)


L = tf.keras.layers


def mlp_body(input_shape, init: InitFn = torch_default_init) -> tf.keras.Model:
  return tf.keras.Sequential(
      [L.InputLayer(input_shape), L.Flatten(),
       _dense(200, fan_in=math.prod(input_shape), init=init, activation="relu")],
      name="mlp_body")


def cifar_cnn_body(input_shape, init: InitFn = torch_default_init) -> tf.keras.Model:
  layers, channels = [L.InputLayer(input_shape)], input_shape[-1]
  for _ in range(2):
    layers += [_conv(64, 5, channels, init, padding="same", activation="relu"),
               L.MaxPool2D(pool_size=3, strides=2, padding="same")]
    channels = 64
  flat = 64 * 8 * 8 if tuple(input_shape[:2]) == (32, 32) else None
  layers += [L.Flatten(), _dense(384, fan_in=flat or 4096, init=init, activation="relu"),
             _dense(192, fan_in=384, init=init, activation="relu")]
  return tf.keras.Sequential(layers, name="cifar_cnn_body")


def conv4_body(input_shape, init: InitFn = torch_default_init) -> tf.keras.Model:
  layers, channels = [L.InputLayer(input_shape)], input_shape[-1]
  for _ in range(4):
    layers += [_conv(64, 3, channels, init, padding="same", activation="relu"),
               L.MaxPool2D(2)]
    channels = 64
  layers += [L.Flatten()]
  return tf.keras.Sequential(layers, name="conv4_body")


BODIES: dict[str, Callable[[tuple, InitFn], tf.keras.Model]] = {
    "mlp": mlp_body, "cifar_cnn": cifar_cnn_body, "conv4": conv4_body}


def build_body(name: str, input_shape: tuple, seed: int | None = None, *,
               initialize: bool = True) -> tf.keras.Model:
  """Builds body `name`; with `seed`, its initial weights are deterministic.

  `initialize=False`: the same layers and variables with every weight zero
  (`zeros_init`), for a computation that assigns the body's weights before using it.
  """
  if not initialize:
    return BODIES[name](tuple(input_shape), zeros_init)
  if seed is not None:
    tf.keras.utils.set_random_seed(seed)
  return BODIES[name](tuple(input_shape), torch_default_init)


def assign_weights(body: tf.keras.Model, weights) -> None:
  """Loads `weights` (tff.learning.models.ModelWeights or alike) into `body`."""
  for variable, value in zip(body.trainable_variables, weights.trainable):
    variable.assign(value)
  for variable, value in zip(body.non_trainable_variables, weights.non_trainable):
    variable.assign(value)
