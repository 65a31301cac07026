"""The server optimizers a process's finalizer applies (`tff.learning.optimizers`)."""

from __future__ import annotations

import tensorflow_federated as tff

NAMES = ("adam", "sgd")


def build_server_optimizer(name: str, learning_rate: float
                           ) -> tff.learning.optimizers.Optimizer:
  """Adam with `tf.keras.optimizers.Adam` semantics, or plain SGD."""
  if name == "adam":
    return tff.learning.optimizers.build_adam(
        learning_rate=learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
  if name == "sgd":
    return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
  raise ValueError(f"unknown server optimizer {name!r}; choose one of {NAMES}")
