"""The unified objective (Hanzely, Zhao, Kolar; spec UNIFIED.md section 1):

    min_{w, beta_1..beta_M}  F(w, beta) = (1/M) sum_m f_m(w, beta_m),

with w shared by all devices and beta_m private to device m. Every family here writes
f_m through the device loss f~_m (a mean loss over the device's examples plus an
optional ridge term) at the global view u = s w, s = 1/sqrt(M) (the paper's
reparametrization; s = 1 with `reparametrize=False`):

    fl      f~_m(u)                                     (4)   no local block
    local   f~_m(beta_m)                                (5)   no global block
    mt2     alpha f~_m(u) + f~_m(beta_m) + (lam/2)|u - beta_m|^2         (8)
    mx2     f~_m(beta_m) + (lam/2)|u - beta_m|^2                         (11)
    apfl2   lam f~_m(u) + f~_m(a u + (1 - a) beta_m)                     (14)
    ews     f~_m on features split [x_g; x_l]: logit x_g.u + x_l.beta_m  (16)

f~_m(theta) = (1/n_m) sum_j l(theta; x_j, y_j) + (ridge/2)|theta|^2, with l the binary
logistic loss (labels 0/1, no bias: the synthetic problems) or the multinomial softmax
cross-entropy with bias (theta = [W; b] flattened, W of shape [d, C]: the real data).
APFL2's mixture puts weight a on the global model, as the reference code does.

A component f_{m,j} is f_m with the mean loss taken on example j alone (the penalty
terms are the same for every j), so f_m = (1/n_m) sum_j f_{m,j}. Everything is float64.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import tensorflow as tf

from tff_pflego.errors import UserError
from tff_pflego.unified.run_config import OBJECTIVES
LOSSES = ("logistic", "softmax")
DTYPE = tf.float64


@dataclasses.dataclass(frozen=True)
class Objective:
  """One member of the family: which form, which loss, and its constants."""
  kind: str
  loss: str
  num_devices: int  # M
  num_features: int  # d, without the bias
  num_classes: int = 2  # C (softmax only)
  penalty: float = 0.0  # lam: MT2/MX2 coupling, APFL2 weight of the global loss
  alpha: float = 1.0  # MT2's weight of f~(u)
  mixture: float = 0.0  # APFL2's a (weight of the global model in the mixture)
  global_features: int = 0  # EWS: the first d_g features are the global block's
  ridge: float = 0.0
  reparametrize: bool = True

  def __post_init__(self):
    problem = self.problem()
    if problem:
      raise UserError(problem)

  def problem(self) -> Optional[str]:
    if self.kind not in OBJECTIVES:
      return f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.kind!r}"
    if self.loss not in LOSSES:
      return f"the loss must be one of {', '.join(LOSSES)}, got {self.loss!r}"
    if self.num_devices < 1 or self.num_features < 1:
      return "an objective needs at least one device and one feature"
    if self.loss == "softmax" and self.num_classes < 2:
      return "a softmax loss needs at least two classes"
    if self.kind in ("mt2", "mx2", "apfl2") and not self.penalty > 0:
      return f"--penalty (lambda) must be > 0 for {self.kind}, got {self.penalty}"
    if self.kind == "mt2" and not self.alpha > 0:
      return f"--alpha must be > 0 for mt2, got {self.alpha}"
    if self.kind == "apfl2" and not 0 <= self.mixture < 1:
      return f"--mixture (APFL2's a) must be in [0, 1), got {self.mixture}"
    if self.kind == "ews":
      if self.loss != "logistic":
        return "ews is defined here for the logistic loss (features split in two blocks)"
      if not 0 < self.global_features < self.num_features:
        return (f"ews needs 0 < global features < {self.num_features}, "
                f"got {self.global_features}")
    if self.ridge < 0:
      return f"--ridge must be >= 0, got {self.ridge}"
    return None

  @property
  def scale(self) -> float:
    """s in u = s w: 1/sqrt(M) reparametrized, else 1."""
    return 1.0 / math.sqrt(self.num_devices) if self.reparametrize else 1.0

  @property
  def model_dim(self) -> int:
    """Size of one f~ argument: d (logistic) or (d + 1) C (softmax with bias)."""
    if self.loss == "logistic":
      return self.num_features
    return (self.num_features + 1) * self.num_classes

  @property
  def global_dim(self) -> int:
    if self.kind == "local":
      return 0
    if self.kind == "ews":
      return self.global_features
    return self.model_dim

  @property
  def local_dim(self) -> int:
    if self.kind == "fl":
      return 0
    if self.kind == "ews":
      return self.num_features - self.global_features
    return self.model_dim

  # --- the device loss -------------------------------------------------------------

  def _mean_loss(self, theta: tf.Tensor, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """(1/b) sum_j l(theta; x_j, y_j) over the batch."""
    if self.loss == "logistic":
      logits = tf.linalg.matvec(x, theta)
      return tf.reduce_mean(tf.math.softplus(logits) - tf.cast(y, DTYPE) * logits)
    weights = tf.reshape(theta, [self.num_features + 1, self.num_classes])
    logits = tf.matmul(x, weights[:-1]) + weights[-1]
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        tf.cast(y, tf.int32), logits))

  def _ridge(self, theta: tf.Tensor) -> tf.Tensor:
    return 0.5 * self.ridge * tf.reduce_sum(tf.square(theta))

  def device_loss_at(self, u: tf.Tensor, beta: tf.Tensor, x: tf.Tensor,
                     y: tf.Tensor) -> tf.Tensor:
    """f_m as a function of the global view u = s w (not of w)."""
    def f_tilde(theta):
      return self._mean_loss(theta, x, y) + self._ridge(theta)

    def coupling():
      return 0.5 * self.penalty * tf.reduce_sum(tf.square(u - beta))

    if self.kind == "fl":
      return f_tilde(u)
    if self.kind == "local":
      return f_tilde(beta)
    if self.kind == "mt2":
      return self.alpha * f_tilde(u) + f_tilde(beta) + coupling()
    if self.kind == "mx2":
      return f_tilde(beta) + coupling()
    if self.kind == "apfl2":
      a = self.mixture
      return self.penalty * f_tilde(u) + f_tilde(a * u + (1.0 - a) * beta)
    # ews
    d_g = self.global_features
    logits = tf.linalg.matvec(x[:, :d_g], u) + tf.linalg.matvec(x[:, d_g:], beta)
    loss = tf.reduce_mean(tf.math.softplus(logits) - tf.cast(y, DTYPE) * logits)
    return loss + self._ridge(tf.concat([u, beta], 0))

  def device_loss(self, w: tf.Tensor, beta: tf.Tensor, x: tf.Tensor,
                  y: tf.Tensor) -> tf.Tensor:
    """f_m(w, beta_m) on the examples (x, y): a component f_{m,j} for one example."""
    return self.device_loss_at(self.scale * w, beta, x, y)

  def device_gradients(self, w: tf.Tensor, beta: tf.Tensor, x: tf.Tensor,
                       y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(grad_w f_m, grad_beta f_m) on the examples (x, y)."""
    with tf.GradientTape() as tape:
      tape.watch([w, beta])
      loss = self.device_loss(w, beta, x, y)
    return tuple(tape.gradient(loss, [w, beta],
                               unconnected_gradients=tf.UnconnectedGradients.ZERO))

  def loss_gradient(self, theta: tf.Tensor, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """grad f~(theta) on the examples (x, y): the device loss alone, no coupling."""
    with tf.GradientTape() as tape:
      tape.watch(theta)
      loss = self._mean_loss(theta, x, y) + self._ridge(theta)
    return tape.gradient(loss, theta)

  def block_gradient(self, block: str, w: tf.Tensor, beta: tf.Tensor, x: tf.Tensor,
                     y: tf.Tensor) -> tf.Tensor:
    """grad_w f_m (block "w") or grad_beta f_m (block "beta") alone: the backward pass
    is taken for that block only (the reference computes both every iteration, B12)."""
    with tf.GradientTape() as tape:
      source = w if block == "w" else beta
      tape.watch(source)
      loss = self.device_loss(w, beta, x, y)
    return tape.gradient(loss, source, unconnected_gradients=tf.UnconnectedGradients.ZERO)

  def predict_local(self, beta: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
    """Class predictions of the local model beta_m alone (how the paper scores tests)."""
    if self.loss == "logistic":
      return tf.cast(tf.linalg.matvec(x, beta) > 0, tf.int32)
    weights = tf.reshape(beta, [self.num_features + 1, self.num_classes])
    return tf.argmax(tf.matmul(x, weights[:-1]) + weights[-1], axis=1, output_type=tf.int32)


@dataclasses.dataclass(frozen=True)
class DeviceData:
  """Every device's examples, stacked: x [M, n, d], y [M, n] (equal n for all)."""
  x: np.ndarray
  y: np.ndarray
  test_x: Optional[np.ndarray] = None
  test_y: Optional[np.ndarray] = None

  @property
  def num_devices(self) -> int:
    return self.x.shape[0]

  @property
  def num_examples(self) -> int:
    return self.x.shape[1]


def objective_value(objective: Objective, w: np.ndarray, betas: np.ndarray,
                    data: DeviceData) -> float:
  """F(w, beta) = (1/M) sum_m f_m(w, beta_m) on every device's full data."""
  return objective_evaluator(objective, data)(w, betas)


def objective_evaluator(objective: Objective, data: DeviceData):
  """(w, betas) -> F(w, beta), with the data converted to tensors once."""
  x, y = tf.constant(data.x, DTYPE), tf.constant(data.y)
  value = _objective_fn(objective)
  return lambda w, betas: float(value(tf.constant(w, DTYPE), tf.constant(betas, DTYPE),
                                      x, y))


_COMPILED: dict = {}


def _objective_fn(objective: Objective):
  if objective not in _COMPILED:
    @tf.function
    def value(w, betas, x, y):
      per_device = tf.map_fn(
          lambda m: objective.device_loss(w, betas[m], x[m], y[m]),
          tf.range(tf.shape(x)[0]), fn_output_signature=DTYPE)
      return tf.reduce_mean(per_device)
    _COMPILED[objective] = value
  return _COMPILED[objective]
