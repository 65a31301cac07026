"""ASCD-PFL (Hanzely et al., spec UNIFIED.md 2.4) on PFLEGO's own objective.

Objective: the EWS form (16) with w = the body theta and beta_i = the head W_i,
F(theta, W) = L(psi) = sum_i alpha_i l_i(W_i, theta), alpha_i = N_i / N: non-convex,
so the step sizes are tuned (not derived from mu, which is 0), nu = 1 (no mu), and the
w / sqrt(M) reparametrization is only a rescaling of the body's step (omitted).

Accelerated block coordinate descent, the reference's frozen-block variant: every
block b (the body; each head) holds y_b and z_b, and an iteration on block b is

  x_b = c z_b + (1 - c) y_b                         (c: `momentum`, the reference's theta)
  y_b <- x_b - eta_b g_b,  z_b <- z_b - kappa eta_b g_b   (kappa = gamma / eta: `z_step`)

with g_b an unbiased estimate of grad_b F at x, while the other blocks' y, z stay as they
are. The body is drawn with probability p_w, the heads with 1 - p_w. One round is one
communication: K ~ Geometric(p_w) - 1 head iterations (local), then one body iteration.

  distributor   draws K from (seed, round) (`head_iterations`) and broadcasts it with
                x_theta (the body iteration's point; y_theta and z_theta stay on the
                server, `CoupledBodyStep`).
  client work   Phi_i = phi(X_i; x_theta) once (1 body forward pass): theta's blocks do
                not move during head iterations, so every one of them runs on these
                cached features, inside one tf.function loop:
                  K times: g = grad_W l_i(x_W; Phi_i), step eta_W = client_lr / ((1 - p_w) q)
                  (1 / (1 - p_w): the block's probability; 1 / q: partial participation,
                  a client takes part in a round with probability q = r / I; alpha_i
                  cancels against a per-head step client_lr / alpha_i)
                then g_i = grad_theta l_i(x_W, x_theta) (1 backward pass) is sent with N_i.
                Heads of clients not in the round stay frozen.
  aggregator    g_hat = (1/q) sum_{I_t} alpha_i g_i, unbiased for grad_theta L
                (`aggregators.build_unbiased_aggregator`, PFLEGO's).
  finalizer     y_theta <- x_theta - (rho / p_w) g_hat, z_theta <- z_theta - kappa (rho /
                p_w) g_hat, x_theta <- c z_theta + (1 - c) y_theta (`CoupledBodyStep`).

The model the server state holds is x_theta (what is broadcast); the iterate that is
evaluated is y_theta with the clients' y_W (`body_weights`, the client state's `head`).
With c = 0 it is plain stochastic block coordinate descent (SCD-PFL).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import aggregators
from tff_pflego.algorithms import composition, instrumentation, pflego, stages
from tff_pflego.algorithms.api import (AlgorithmConfig, ClientDataComputations,
                                       PersonalizedAlgorithm, ServerState)
from tff_pflego.algorithms.model_types import (BodyFn, ModelTypes, initial_client_state,
                                               model_types)
from tff_pflego.models import heads

HEAD_Z = "head_z"  # the client state's z_W (its `head` is y_W)


def couple(y, z, momentum: float):
  """x = c z + (1 - c) y, leaf by leaf."""
  return tf.nest.map_structure(lambda a, b: momentum * b + (1.0 - momentum) * a, y, z)


def head_iterations(seed: int, round_num: tf.Tensor, p_w: float) -> tf.Tensor:
  """K ~ Geometric(p_w) - 1 (P(K = k) = (1 - p_w)^k p_w), a function of (seed, round):
  K = floor(log(1 - U) / log(1 - p_w)) with U uniform on [0, 1)."""
  u = tf.random.stateless_uniform(
      [], seed=tf.stack([tf.constant(seed, tf.int64), tf.cast(round_num, tf.int64)]),
      dtype=tf.float64)
  return tf.cast(tf.floor(tf.math.log1p(-u) / np.log1p(-p_w)), tf.int32)


class CoupledBodyStep(tff.learning.optimizers.Optimizer):
  """The body's ASCD iteration as a `tff.learning` optimizer on x_theta.

  The state holds y_theta - x_theta and z_theta - x_theta (both 0 at the start, where
  y = z = x = the initial body), so it needs no initial values beyond the weights.
  """

  def __init__(self, learning_rate: float, p_w: float, momentum: float, z_step: float):
    self._step = learning_rate / p_w
    self._momentum = momentum
    self._z_step = z_step

  def initialize(self, specs):
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), specs)
    return collections.OrderedDict(y_offset=zeros, z_offset=zeros)

  def next(self, state, weights, gradients):
    y = tf.nest.map_structure(lambda x, g: x - self._step * g, weights, gradients)
    z = tf.nest.map_structure(lambda x, d, g: x + d - self._z_step * self._step * g,
                              weights, state["z_offset"], gradients)
    x = couple(y, z, self._momentum)
    offset = lambda a: tf.nest.map_structure(tf.subtract, a, x)
    return collections.OrderedDict(y_offset=offset(y), z_offset=offset(z)), x


def head_coordinate_steps(features: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor,
                          y_head, z_head, num_iterations: tf.Tensor, step: float,
                          momentum: float, z_step: float):
  """`num_iterations` ASCD head iterations on cached features -> (y_W, z_W); the
  gradient in closed form on the transposed head, the loop fused by XLA, as PFLEGO's
  head-only steps (`pflego.transposed_head_loss`)."""
  loss_and_grads = pflego.transposed_head_loss(features, labels, mask)

  def iteration(i, y_kernel, y_bias, z_kernel, z_bias):
    x_kernel, x_bias = couple((y_kernel, y_bias), (z_kernel, z_bias), momentum)
    _, g_kernel, g_bias = loss_and_grads(x_kernel, x_bias)
    return (i + 1, x_kernel - step * g_kernel, x_bias - step * g_bias,
            z_kernel - z_step * step * g_kernel, z_bias - z_step * step * g_bias)

  @tf.function(jit_compile=True)
  def loop(*heads_t):
    return tf.while_loop(lambda i, *_: i < num_iterations, iteration,
                         (tf.constant(0),) + heads_t)[1:]

  as_tensor = lambda t: tf.convert_to_tensor(t, tf.float32)
  y_kernel, y_bias, z_kernel, z_bias = loop(
      tf.transpose(as_tensor(y_head["kernel"])), as_tensor(y_head["bias"]),
      tf.transpose(as_tensor(z_head["kernel"])), as_tensor(z_head["bias"]))
  head = lambda kernel, bias: collections.OrderedDict(kernel=tf.transpose(kernel),
                                                      bias=bias)
  return head(y_kernel, y_bias), head(z_kernel, z_bias)


def make_client_update(body: tf.keras.Model, counter: instrumentation.BodyPassCounter, *,
                       max_classes: int, client_lr: float, p_w: float,
                       participation_prob: float, momentum: float, z_step: float):
  """A client's K head iterations and its body gradient (module docstring)."""
  head_step = client_lr / ((1.0 - p_w) * participation_prob)

  def update(broadcast, dataset, client_state):
    def head_work(features, labels, mask):
      y_head, z_head = head_coordinate_steps(
          features, labels, mask, client_state["head"], client_state[HEAD_Z],
          broadcast["head_iterations"], head_step, momentum, z_step)
      return couple(y_head, z_head, momentum), (y_head, z_head)

    step = pflego.cached_features_step(body, counter, broadcast["model"], dataset,
                                       client_state, max_classes, head_work,
                                       differentiate_head=False)
    y_head, z_head = step["extra"]
    return pflego.client_output(counter, client_state, step, collections.OrderedDict(
        [("head", y_head), (HEAD_Z, z_head)]))

  return update


def ascd_model_types(body_fn: BodyFn, image_shape: tuple, max_classes: int) -> ModelTypes:
  """`model_types.model_types` with the client state's `head_z` (z_W) beside `head`."""
  types = model_types(body_fn, image_shape, max_classes)
  members = collections.OrderedDict(
      (name, member) for name, member in tff.structure.iter_elements(types.client_state))
  members[HEAD_Z] = members["head"]
  state_type = tff.types.StructWithPythonType(list(members.items()),
                                              collections.OrderedDict)
  return dataclasses.replace(types, client_state=state_type)


def build_distributor(weights_type, seed: int, p_w: float) -> stages.SplitDistributor:
  """Broadcasts {model: x_theta, head_iterations: K}, K from (seed, round)."""

  @tff.tensorflow.computation
  def first_round():
    return tf.constant(0, tf.int32)

  @tff.tensorflow.computation(np.int32, weights_type)
  def server(round_num, model):
    k = head_iterations(seed, round_num, p_w)
    return (round_num + 1, collections.OrderedDict(model=model, head_iterations=k),
            collections.OrderedDict(head_iterations=k))

  return stages.SplitDistributor(first_round, server)


def build_ascd_pfl_process(
    body_fn: BodyFn, *, image_shape: tuple, max_classes: int, total_examples: int,
    participation_prob: float, client_lr: float, server_lr: float, p_w: float,
    momentum: float, z_step: float, seed: int,
    client_data: Optional[tff.Computation] = None) -> tff.templates.IterativeProcess:
  """ASCD-PFL as a `tff.templates.IterativeProcess` (see the module docstring).

  Args as `pflego.build_pflego_process`, and p_w in (0, 1) (the body's probability),
  momentum c in [0, 1), z_step kappa > 0, seed (of the K draws). `next(state, client
  data, client states)`; client states are `model_types.initial_client_state`s with
  `head_z` (`initial_ascd_client_state`).
  """
  if not 0 < p_w < 1:
    raise ValueError(f"p_w must be in (0, 1), got {p_w}")
  if not 0 <= momentum < 1:
    raise ValueError(f"momentum must be in [0, 1), got {momentum}")
  if z_step <= 0:
    raise ValueError(f"z_step must be > 0, got {z_step}")
  if not 0 < participation_prob <= 1:
    raise ValueError(f"participation_prob must be in (0, 1], got {participation_prob}")
  types = ascd_model_types(body_fn, image_shape, max_classes)
  state_type = types.client_state
  distributor = build_distributor(types.weights, seed, p_w)
  broadcast_type = distributor.next.type_signature.result.result.member

  @tff.tensorflow.computation(broadcast_type, types.dataset, state_type)
  def client_work(broadcast, dataset, client_state):
    counter = instrumentation.BodyPassCounter()
    update = make_client_update(
        body_fn(initialize=False), counter, max_classes=max_classes, client_lr=client_lr, p_w=p_w,
        participation_prob=participation_prob, momentum=momentum, z_step=z_step)
    return tf.function(instrumentation.timed(update))(broadcast, dataset, client_state)

  aggregator = aggregators.build_unbiased_aggregator(
      types.weights.trainable, participation_prob, total_examples)
  finalizer = stages.optimizer_finalizer(
      CoupledBodyStep(server_lr, p_w, momentum, z_step), types.weights)

  @tff.tensorflow.computation
  def initial_body():
    return tff.learning.models.ModelWeights.from_model(body_fn())

  return composition.compose_process(initial_body, distributor, client_work, aggregator,
                                     finalizer, types.dataset, state_type, client_data)


def body_weights(state: ServerState) -> tff.learning.models.ModelWeights:
  """y_theta, the iterate evaluated: x_theta plus the optimizer state's offset."""
  offset = state.finalizer["y_offset"]
  return tff.learning.models.ModelWeights(
      trainable=[np.asarray(x) + np.asarray(d)
                 for x, d in zip(state.model.trainable, offset)],
      non_trainable=list(state.model.non_trainable))


def initial_ascd_client_state(client_index: int, num_classes: int, **kwargs
                              ) -> collections.OrderedDict:
  """`model_types.initial_client_state` with z_W = y_W = the fresh head."""
  state = initial_client_state(client_index, num_classes, **kwargs)
  state[HEAD_Z] = collections.OrderedDict(
      (name, np.copy(value)) for name, value in state["head"].items())
  return state


def build(config: AlgorithmConfig,
          client_data: Optional[ClientDataComputations] = None) -> PersonalizedAlgorithm:
  """ASCD-PFL from its configuration (`api.Builder`)."""
  body_fn = config.body_fn()
  types = ascd_model_types(body_fn, config.image_shape, config.max_classes)
  process = build_ascd_pfl_process(
      body_fn, image_shape=config.image_shape, max_classes=config.max_classes,
      total_examples=config.total_examples,
      participation_prob=config.participation_prob, client_lr=config.client_lr,
      server_lr=config.server_lr, p_w=config.ascd_p_w, momentum=config.ascd_momentum,
      z_step=config.ascd_z_step, seed=config.seed,
      client_data=client_data and client_data.train)
  return PersonalizedAlgorithm(
      name="ascd_pfl", process=process, body_fn=body_fn, types=types,
      body_weights=body_weights,
      initial_client_state=functools.partial(
          initial_ascd_client_state, feature_dim=types.feature_dim,
          max_classes=types.max_classes, seed=config.seed),
      broadcast_type=tff.types.to_type(collections.OrderedDict(
          model=types.weights, head_iterations=np.int32)),  # as `build_distributor`'s
      update_type=types.weights.trainable,
      takes_client_ids=client_data is not None)
