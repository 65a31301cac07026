"""The server optimizers a process's finalizer applies (`tff.learning.optimizers`),
with an optional learning-rate schedule over the run's rounds."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms.options import SERVER_LR_SCHEDULES, SERVER_OPTIMIZERS


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
    raise ValueError(f"unknown server optimizer {name!r}; choose one of {SERVER_OPTIMIZERS}")
  if schedule == "constant":
    return optimizer
  if schedule == "cosine":
    if rounds < 1:
      raise ValueError(f"a cosine schedule needs rounds >= 1, got {rounds}")
    return tff.learning.optimizers.schedule_learning_rate(
        optimizer, cosine_rate(learning_rate, final_fraction, rounds))
  raise ValueError(f"unknown schedule {schedule!r}; choose one of {SERVER_LR_SCHEDULES}")


def from_config(config) -> tff.learning.optimizers.Optimizer:
  """The server optimizer an `AlgorithmConfig` asks for."""
  return build_server_optimizer(config.server_optimizer, config.server_lr,
                                config.server_lr_schedule,
                                config.server_lr_final_fraction, config.schedule_rounds)


def rate_at(config, step: int) -> float:
  """The rate of server step `step` (0: round 1) of an `AlgorithmConfig`'s optimizer."""
  if config.server_lr_schedule == "constant":
    return float(config.server_lr)
  return float(cosine_rate(config.server_lr, config.server_lr_final_fraction,
                           config.schedule_rounds)(step))


def adam_state(finalizer_state: Any) -> Optional[Mapping]:
  """Adam's state (`build_adam`) inside a finalizer's state, scheduled or not; None
  for any other optimizer's."""
  if not isinstance(finalizer_state, Mapping):
    return None
  state = finalizer_state.get("optimizer", finalizer_state)
  return state if isinstance(state, Mapping) and "preconditioner" in state else None


def adam_effective_rates(state: Mapping, learning_rate: float) -> list[np.ndarray]:
  """Per weight, the rate at which Adam's last update moved it along its first moment
  m (an SGD step on m at this rate is Adam's step), from Adam's state after that update
  (`build_adam`, Keras semantics; t = its step count, v its second moment):
  rho sqrt(1 - beta_2^t) / (1 - beta_1^t) / (sqrt(v) + eps), `learning_rate` the rate
  rho that update used (`rate_at(config, t - 1)`)."""
  t = float(np.asarray(state["step"]))
  beta_1, beta_2, epsilon = (float(np.asarray(state[k]))
                             for k in ("beta_1", "beta_2", "epsilon"))
  scale = learning_rate * math.sqrt(1.0 - beta_2 ** t) / (1.0 - beta_1 ** t)
  return [scale / (np.sqrt(np.asarray(v, np.float64)) + epsilon)
          for v in tf.nest.flatten(state["preconditioner"])]


def adam_last_step(state: Mapping, learning_rate: float) -> list[np.ndarray]:
  """What Adam's last update added to each weight tensor: -(effective rate) * m
  (`adam_effective_rates`)."""
  return [-rate * np.asarray(m, np.float64) for rate, m in zip(
      adam_effective_rates(state, learning_rate), tf.nest.flatten(state["accumulator"]))]
