"""The server optimizers a process's finalizer applies (`tff.learning.optimizers`),
with an optional learning-rate schedule over the run's rounds."""

from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff

NAMES = ("adam", "sgd")
SCHEDULES = ("constant", "cosine")


def cosine_rate(learning_rate: float, final_fraction: float, rounds: int
                ) -> Callable[[tf.Tensor], tf.Tensor]:
  """rho_i = rho (f + (1 - f) (1 + cos(pi i / (T - 1))) / 2) for the i-th server step
  (i = 0 in round 1): rho in round 1, f rho in round T, held at f rho after T."""
  span = float(max(rounds - 1, 1))

  def rate(step: tf.Tensor) -> tf.Tensor:
    progress = tf.minimum(tf.cast(step, tf.float32) / span, 1.0)
    return learning_rate * (final_fraction + (1.0 - final_fraction) * 0.5
                            * (1.0 + tf.cos(math.pi * progress)))
  return rate


def build_server_optimizer(name: str, learning_rate: float, schedule: str = "constant",
                           final_fraction: float = 0.1, rounds: int = 0
                           ) -> tff.learning.optimizers.Optimizer:
  """Adam with `tf.keras.optimizers.Adam` semantics, or plain SGD; with
  schedule="cosine" its rate decays from `learning_rate` to `final_fraction` of it
  over `rounds` server steps (`cosine_rate`)."""
  if name == "adam":
    optimizer = tff.learning.optimizers.build_adam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
  elif name == "sgd":
    optimizer = tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
  else:
    raise ValueError(f"unknown server optimizer {name!r}; choose one of {NAMES}")
  if schedule == "constant":
    return optimizer
  if schedule == "cosine":
    if rounds < 1:
      raise ValueError(f"a cosine schedule needs rounds >= 1, got {rounds}")
    return tff.learning.optimizers.schedule_learning_rate(
        optimizer, cosine_rate(learning_rate, final_fraction, rounds))
  raise ValueError(f"unknown schedule {schedule!r}; choose one of {SCHEDULES}")


def from_config(config) -> tff.learning.optimizers.Optimizer:
  """The server optimizer an `AlgorithmConfig` asks for."""
  return build_server_optimizer(config.server_optimizer, config.server_lr,
                                config.server_lr_schedule,
                                config.server_lr_final_fraction, config.schedule_rounds)
