"""Local training shared by every baseline: full-batch gradient descent on chosen parts.

A client's model is a body phi(.; theta) and a linear head (W, b) (padded to K_max and
masked, `tff_pflego.models.heads`). A local *phase* runs `steps` full-batch GD steps
(with optional heavy-ball momentum) on the head, the body or both:

    m <- momentum m + grad_v F(v),   v <- v - lr m       (m = 0 at the start of a phase)

on the local objective

    F(theta, W) = l_i(W, theta) + (mu / 2) ||(theta, W)_shared - (theta, W)_round||^2,

where the proximal term (FedProx, Ditto) pulls the weights that the server shares
toward the round's broadcast values. Every evaluation of l_i runs the body through the
`BodyPassCounter`, so the cost ledger counts passes as they run: a step that trains the
body costs one forward and one backward pass, a head-only step costs one forward pass
(the baselines, unlike PFLEGO, recompute the features, as published; with
`cache_head_features` a head-only phase computes them once: the same numbers).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, Sequence

import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms import instrumentation
from tff_pflego.models import heads

PARTS = ("head", "body", "both")  # and "none", for the variables a client shares


@dataclasses.dataclass(frozen=True)
class LocalPhase:
  """`steps` GD steps on `trains` ("head", "body" or "both") at rate `lr`."""
  trains: str
  steps: int
  lr: float
  momentum: float = 0.0

  def __post_init__(self):
    if self.trains not in PARTS:
      raise ValueError(f"a phase trains one of {PARTS}, got {self.trains!r}")
    if self.steps < 0:
      raise ValueError(f"steps must be >= 0, got {self.steps}")
    if self.momentum is None or not 0 <= self.momentum < 1:
      raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

  @property
  def head_alone(self) -> bool:
    """Whether the phase takes steps on the head alone (features fixed by the body)."""
    return self.trains == "head" and self.steps > 0


def gradient_descent(loss_fn: Callable[[], tf.Tensor], variables: Sequence[tf.Variable],
                     steps: int, lr: float, momentum: float = 0.0) -> None:
  """`steps` full-batch steps of `tff.learning.optimizers.build_sgdm` (heavy ball:
  m <- momentum m + g, v <- v - lr m; plain GD when momentum is 0) on `variables`,
  in a `tf.while_loop`."""
  if steps == 0 or not variables:
    return
  variables = list(variables)
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=lr,
                                                 momentum=momentum or None)
  initial = optimizer.initialize([tf.TensorSpec(v.shape, v.dtype) for v in variables])

  def step(i, state):
    # Only the trained variables are watched: a head-only step records no body ops, so
    # it runs (and counts) no body backward pass.
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(variables)
      loss = loss_fn()
    grads = tape.gradient(loss, variables)
    state, new_values = optimizer.next(state, [v.read_value() for v in variables], grads)
    updates = [v.assign(w) for v, w in zip(variables, new_values)]
    with tf.control_dependencies(updates):
      return i + 1, tf.nest.map_structure(tf.identity, state)

  tf.while_loop(lambda i, _: i < steps, step, (tf.constant(0), initial))


class LocalModel(tf.Module):
  """A client's body and head as variables, with the local objective F."""

  def __init__(self, body: tf.keras.Model, counter: instrumentation.BodyPassCounter,
               feature_dim: int, max_classes: int):
    super().__init__(name="local_model")
    self.body = body
    self.counter = counter
    self.kernel = tf.Variable(tf.zeros((feature_dim, max_classes)), name="head_kernel")
    self.bias = tf.Variable(tf.zeros((max_classes,)), name="head_bias")

  @property
  def head(self) -> collections.OrderedDict:
    return collections.OrderedDict(kernel=self.kernel.read_value(),
                                   bias=self.bias.read_value())

  def assign_head(self, head) -> None:
    self.kernel.assign(head["kernel"])
    self.bias.assign(head["bias"])

  def variables_of(self, part: str) -> list[tf.Variable]:
    head = [self.kernel, self.bias]
    if part == "none":
      return []
    if part == "head":
      return head
    if part == "body":
      return list(self.body.trainable_variables)
    return list(self.body.trainable_variables) + head

  def loss_and_accuracy(self, x, y, mask) -> tuple[tf.Tensor, tf.Tensor]:
    return heads.head_loss_and_accuracy(self.counter.counted_call(self.body, x), y,
                                        self.kernel, self.bias, mask)

  def train(self, phases: Sequence[LocalPhase], x, y, mask, prox_mu: float = 0.0,
            anchor: Sequence[tf.Tensor] = (), anchored: Sequence[tf.Variable] = (),
            cache_head_features: bool = False) -> None:
    """Runs the phases on F; `anchored` variables are pulled toward `anchor` by mu.

    With `cache_head_features`, a head-only phase computes phi(X; theta) once and takes
    its steps on those features: the same numbers (theta does not move in the phase),
    one body forward pass instead of one per step."""

    def objective(features=None):
      if features is None:
        loss, _ = self.loss_and_accuracy(x, y, mask)
      else:
        loss, _ = heads.head_loss_and_accuracy(features, y, self.kernel, self.bias, mask)
      if prox_mu:
        loss += 0.5 * prox_mu * tf.add_n([tf.reduce_sum(tf.square(v - a))
                                          for v, a in zip(anchored, anchor)])
      return loss

    for phase in phases:
      loss_fn = objective
      if cache_head_features and phase.head_alone:
        features = self.counter.counted_call(self.body, x)
        loss_fn = functools.partial(objective, features)
      gradient_descent(loss_fn, self.variables_of(phase.trains), phase.steps,
                       phase.lr, phase.momentum)
