"""PFLEGO: personalized federated learning with exact stochastic gradient descent.

Model: shared body phi(x; theta) and a personal linear head W_i per client;
objective L(psi) = sum_i alpha_i l_i(W_i, theta), alpha_i = N_i / N.

One round (Algorithm 1 of the paper), with q = P(i in I_t) = r / I:

  distributor   theta_{t-1} is broadcast to the sampled clients I_t.
  client work   Phi_i = phi(X_i; theta_{t-1})                  (1 body forward pass)
                tau - 1 times: W_i <- W_i - beta grad_W l_i(W_i; Phi_i)  (no body pass;
                  or monotone GD, which never increases l_i)
                g_W, g_i = grad_{W, theta} l_i(W_i, theta_{t-1})  (1 forward + 1 backward)
                W_i <- W_i - rho (1/q) alpha_i g_W       (exact SGD, eq. 5; default)
                  or W_i <- W_i - rho (1/q) g_W          (paper eq. 3 / reference code)
                sends g_i and N_i.
  aggregator    g_hat = (1/q) sum_{I_t} alpha_i g_i = (sum_{I_t} N_i / (q N)) m, with
                m = sum_{I_t} N_i g_i / sum_{I_t} N_i a weighted mean: unbiased for
                grad_theta L since E[1{i in I_t}] = q (`aggregators.py`); an update
                holding NaN/Inf is rejected (weight 0) and counted.
  finalizer     theta_t = Optimizer(theta_{t-1}, g_hat): SGD (theta - rho g_hat, so that
                with r = I a round is one full-batch GD step on L(psi)) or Adam.

Heads are CLIENTS-placed inputs and outputs of `next`; they never reach the server.
"""

from __future__ import annotations

import collections
from typing import NamedTuple, Optional, Union

import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import aggregators
from tff_pflego.algorithms import common, composition
from tff_pflego.models import heads

HEAD_STEPS = ("exact", "paper_code")


class PflegoState(NamedTuple):
  """Server state: body weights, the composed parts' states and the round number."""
  body: tff.learning.models.ModelWeights
  distributor: object
  aggregator: object
  finalizer: object
  round_num: object


def make_client_update(body: tf.keras.Model, counter: common.BodyPassCounter, *,
                       max_classes: int, local_steps: int, client_lr: float,
                       server_lr: float, participation_prob: float,
                       total_examples: int, head_step: str = "exact",
                       head_optimizer: str = "gd"):
  """PFLEGO's client update as a plain TF function of (weights, dataset, client state).

  Used inside the TFF client computation and, unchanged, by the plain-TF benchmark.
  """
  if head_step not in HEAD_STEPS:
    raise ValueError(f"head_step must be one of {HEAD_STEPS}, got {head_step!r}")
  head_scale = server_lr / participation_prob

  def update(weights, dataset, client_state):
    common.assign_weights(body, weights)
    timing = {}
    batch = common.load_full_batch(dataset, timing)
    x, y = batch["x"], batch["y"]
    num_examples = tf.cast(tf.shape(y)[0], tf.float32)
    mask = heads.class_mask(client_state["num_classes"], max_classes)

    cached_features = counter.counted_call(body, x)
    head = common.head_gradient_steps(cached_features, y, client_state["head"], mask,
                                      local_steps - 1, client_lr, head_optimizer)
    with tf.GradientTape() as tape:
      tape.watch(head)
      loss, accuracy = heads.head_loss_and_accuracy(
          counter.counted_call(body, x), y, head["kernel"], head["bias"], mask)
    body_grads, head_grads = tape.gradient(loss, (body.trainable_variables, head))

    step = head_scale * (num_examples / total_examples if head_step == "exact" else 1.0)
    new_head = tf.nest.map_structure(lambda w, g: w - step * g, head, head_grads)
    new_state = collections.OrderedDict(
        client_index=client_state["client_index"],
        num_classes=client_state["num_classes"], head=new_head)
    metrics = collections.OrderedDict(
        client_index=client_state["client_index"], loss=loss, accuracy=accuracy,
        num_examples=num_examples, **counter.counts(), **timing)
    return collections.OrderedDict(update=body_grads, update_weight=num_examples,
                                   client_state=new_state, metrics=metrics)

  return update


def build_pflego_client_work(body_fn: common.BodyFn, types: common.ModelTypes,
                             **hparams) -> tff.Computation:
  """The client computation (body weights, dataset, client state) -> client output."""

  @tff.tensorflow.computation(types.weights, types.dataset, types.client_state)
  def client_work(weights, dataset, client_state):
    counter = common.BodyPassCounter()
    update = make_client_update(body_fn(), counter, max_classes=types.max_classes,
                                **hparams)
    return tf.function(common.timed(update))(weights, dataset, client_state)

  return client_work


def build_pflego_process(
    body_fn: common.BodyFn, *, image_shape: tuple, max_classes: int,
    total_examples: int, participation_prob: float, local_steps: int,
    client_lr: float, server_lr: float,
    server_optimizer: Union[str, tff.learning.optimizers.Optimizer] = "adam",
    head_step: str = "exact", head_optimizer: str = "gd",
    client_data: Optional[tff.Computation] = None
) -> tff.templates.IterativeProcess:
  """Builds PFLEGO as a `tff.templates.IterativeProcess` (see the module docstring).

  Args:
    body_fn: no-arg callable building the Keras body (called inside computations).
    image_shape: shape of one input example, e.g. (28, 28, 1).
    max_classes: K_max; heads are padded to it and masked to each client's K_i.
    total_examples: N = sum_i N_i over ALL clients (for alpha_i = N_i / N).
    participation_prob: q = r / I (fixed r) or pi (Binomial participation).
    local_steps: tau >= 1; tau - 1 head-only steps precede the joint gradient.
    client_lr: beta, the head-only step size.
    server_lr: rho, the server (and final head) step size.
    server_optimizer: "adam", "sgd" or a `tff.learning.optimizers.Optimizer`.
    head_step: "exact" (rho/q * alpha_i, eq. 5) or "paper_code" (rho/q, eq. 3).
    head_optimizer: "gd" or "monotone_gd" for the tau - 1 head-only steps
      (`common.head_gradient_steps`).
    client_data: optional TFF computation client id -> `{x, y}` dataset; given, `next`
      takes client ids and each client reads its data inside its own computation
      (`composition.with_client_data`).

  Returns:
    A process with `initialize() -> PflegoState@SERVER` and
    `next(state, client_data, client_states) -> (state, client_states, metrics)`, where
    `client_data` are `{x, y}` datasets and `client_states` the clients' heads
    (`common.initial_client_state`), both CLIENTS-placed; `metrics` holds `train`
    (aggregates @SERVER) and `clients` (per-client loss, accuracy and body pass
    counts @CLIENTS, each with its `client_index`).
  """
  if local_steps < 1:
    raise ValueError(f"local_steps must be >= 1, got {local_steps}")
  if not 0 < participation_prob <= 1:
    raise ValueError(f"participation_prob must be in (0, 1], got {participation_prob}")
  types = common.model_types(body_fn, image_shape, max_classes)
  if isinstance(server_optimizer, str):
    server_optimizer = common.build_server_optimizer(server_optimizer, server_lr)

  distributor = tff.learning.templates.build_broadcast_process(types.weights)
  client_work = build_pflego_client_work(
      body_fn, types, local_steps=local_steps, client_lr=client_lr,
      server_lr=server_lr, participation_prob=participation_prob,
      total_examples=total_examples, head_step=head_step, head_optimizer=head_optimizer)
  aggregator = aggregators.build_unbiased_aggregator(
      types.weights.trainable, participation_prob, total_examples)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, types.weights)

  @tff.tensorflow.computation
  def initial_body():
    return tff.learning.models.ModelWeights.from_model(body_fn())

  return composition.compose_process(PflegoState, initial_body, distributor, client_work,
                                    aggregator, finalizer, types.dataset,
                                    types.client_state, client_data)


def body_weights(state: PflegoState) -> tff.learning.models.ModelWeights:
  """The body weights held in a server state returned by `initialize` or `next`."""
  return state.body
