"""The baselines (FedAvg, FedProx, FedPer, FedRep, FedBabu, Ditto, FedRecon) as one process.

They differ only in their `AveragingPlan`: which local phases a client runs
(`local_training.LocalPhase`) and whether the head is shared or personal.

  distributor   the shared weights w_t (the body theta, plus the head when it is shared)
                are broadcast to the sampled clients.
  client work   the client loads w_t (and its own head when the head is personal), runs
                the plan's phases of full-batch GD on
                  F_i = l_i + (mu/2) ||w - w_t||^2     (mu = 0 but for FedProx)
                and sends delta_i = w_t - w_i and N_i; a personal head stays with it.
  aggregator    weighted mean sum_S N_i delta_i / sum_S N_i (`tff.aggregators.MeanFactory`;
                a delta holding NaN/Inf is rejected, `aggregators.NonFiniteRejectionFactory`).
  finalizer     w_{t+1} = w_t - mean delta = sum_S N_i w_i / sum_S N_i (SGD at rate 1).

Plans (spec section 4), tau = local steps, beta = client rate:
  fedavg   both parts, tau steps; the head is shared (sized K_max, masked per client)
  fedprox  fedavg with the proximal term mu
  fedper   both parts, tau steps; personal head
  fedrep   head only for tau - body_steps steps, then body only for body_steps steps
  fedbabu  body only, body_steps steps with momentum 0.9; the head keeps its orthogonal
           initialization (the same for every client) and is never trained
  ditto    the global model as fedavg; each client also trains its personal model v_i
           (its own body and head, kept in its state) by the same tau steps on
           l_i(v) + (mu/2)||v - w_t||^2; evaluation uses v_i
  fedrecon reconstruct the personal head (tau head-only steps from the client's stored
           head, body fixed), then send g_i = grad_theta l_i at the reconstructed head;
           the server applies the weighted mean of the g_i with Adam (rate rho):
           block-coordinate descent, not exact SGD
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import aggregators
from tff_pflego.algorithms import common, composition
from tff_pflego.algorithms.local_training import LocalModel, LocalPhase
from tff_pflego.models import heads


@dataclasses.dataclass(frozen=True)
class AveragingPlan:
  phases: tuple[LocalPhase, ...]
  shared_head: bool = False
  prox_mu: float = 0.0
  # FedRecon: after the phases, send grad_theta l_i at the reconstructed head instead of
  # a model delta; the server applies it with `server_optimizer`.
  send_gradient: bool = False
  # Ditto: after the global update, the client's personal model (its own body and head,
  # in its state) runs the same phases on l_i + (mu/2)||v - w_t||^2, w_t the broadcast.
  personal_mu: float | None = None


class AveragingState(NamedTuple):
  """Server state: the shared weights (body, and the head for FedAvg/FedProx)."""
  model: tff.learning.models.ModelWeights  # trainable = body's [+ head kernel, bias]
  distributor: object
  aggregator: object
  finalizer: object
  round_num: object


def shared_weights_type(types: common.ModelTypes, shared_head: bool):
  if not shared_head:
    return types.weights
  head = types.client_state.head
  return tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=list(types.weights.trainable) + [head.kernel, head.bias],
      non_trainable=list(types.weights.non_trainable)))


def split_shared(weights, num_body_trainable: int, shared_head: bool):
  """Shared weights -> (body ModelWeights, shared head or None)."""
  trainable = list(weights.trainable)
  body = tff.learning.models.ModelWeights(trainable=trainable[:num_body_trainable],
                                          non_trainable=list(weights.non_trainable))
  if not shared_head:
    return body, None
  kernel, bias = trainable[num_body_trainable:]
  return body, collections.OrderedDict(kernel=kernel, bias=bias)


def make_averaging_client_update(model: LocalModel, plan: AveragingPlan, max_classes: int,
                                 num_body_trainable: int):
  """The client update as a plain TF function of (shared weights, dataset, state)."""

  def update(shared, dataset, client_state):
    body_weights, shared_head = split_shared(shared, num_body_trainable, plan.shared_head)
    common.assign_weights(model.body, body_weights)
    model.assign_head(shared_head if plan.shared_head else client_state["head"])
    timing = {}
    batch = common.load_full_batch(dataset, timing)
    x, y = batch["x"], batch["y"]
    mask = heads.class_mask(client_state["num_classes"], max_classes)
    # The metrics' loss is taken before training, outside the pass counter.
    loss, accuracy = heads.head_loss_and_accuracy(
        model.body(x, training=False), y, model.kernel, model.bias, mask)

    anchored = model.variables_of("both" if plan.shared_head else "body")
    anchor = [tf.identity(v) for v in anchored]
    with tf.control_dependencies([loss, accuracy]):
      model.train(plan.phases, x, y, mask, plan.prox_mu, anchor, anchored)
    if plan.send_gradient:
      body_vars = model.variables_of("body")
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(body_vars)
        local_loss, _ = model.loss_and_accuracy(x, y, mask)
      delta = tape.gradient(local_loss, body_vars)
    else:
      delta = [a - v.read_value() for a, v in zip(anchor, anchored)]
    new_state = collections.OrderedDict(
        client_index=client_state["client_index"],
        num_classes=client_state["num_classes"],
        head=client_state["head"] if plan.shared_head else model.head)
    if plan.personal_mu is not None:
      with tf.control_dependencies(delta):
        for variable, value in zip(model.variables_of("body"), client_state["body"]):
          variable.assign(value)
        model.assign_head(client_state["head"])
      model.train(plan.phases, x, y, mask, plan.personal_mu, anchor,
                  model.variables_of("both"))
      new_state["head"] = model.head
      new_state["body"] = [v.read_value() for v in model.variables_of("body")]
    metrics = collections.OrderedDict(
        client_index=client_state["client_index"], loss=loss, accuracy=accuracy,
        num_examples=tf.cast(tf.shape(y)[0], tf.float32), **model.counter.counts(), **timing)
    return collections.OrderedDict(update=delta, update_weight=metrics["num_examples"],
                                   client_state=new_state, metrics=metrics)

  return update


def local_test_metrics(model: LocalModel, test_dataset: tf.data.Dataset,
                       client_state, max_classes: int) -> collections.OrderedDict:
  """The client's local model (its variables now) on its test data: the reference
  code's evaluation protocol, outside the pass counter and the client's timing."""
  mask = heads.class_mask(client_state["num_classes"], max_classes)
  loss, accuracy, num_test = common.score_on_dataset(
      model.body, test_dataset, dict(kernel=model.kernel, bias=model.bias), mask)
  return collections.OrderedDict(test_loss=loss, test_accuracy=accuracy,
                                 num_test=tf.cast(num_test, tf.float32))


def build_averaging_client_work(body_fn: common.BodyFn, plan: AveragingPlan,
                                types: common.ModelTypes, local_evaluation: bool = False
                                ) -> tff.Computation:
  """The client computation (shared weights, data, client state) -> client output.

  With `local_evaluation` the data is OrderedDict(train=dataset, test=dataset) and the
  metrics gain the local model's `test_loss`, `test_accuracy` and `num_test` right
  after the update (for Ditto: the personal model; FedRecon: the reconstructed head).
  """
  shared_type = shared_weights_type(types, plan.shared_head)
  num_body_trainable = len(types.weights.trainable)
  data_type = common.train_and_test_type(types) if local_evaluation else types.dataset

  @tff.tensorflow.computation(shared_type, data_type, types.client_state)
  def client_work(shared, data, client_state):
    model = LocalModel(body_fn(), common.BodyPassCounter(), types.feature_dim,
                       types.max_classes)
    update = common.timed(make_averaging_client_update(model, plan, types.max_classes,
                                                       num_body_trainable))
    if not local_evaluation:
      return tf.function(update)(shared, data, client_state)

    @tf.function
    def update_and_evaluate(shared, data, client_state):
      output = update(shared, data["train"], client_state)
      output["metrics"].update(local_test_metrics(model, data["test"], client_state,
                                                  types.max_classes))
      return output

    return update_and_evaluate(shared, data, client_state)

  return client_work


def build_averaging_process(body_fn: common.BodyFn, plan: AveragingPlan, *,
                            image_shape: tuple, max_classes: int, seed: int = 0,
                            server_optimizer: tff.learning.optimizers.Optimizer | None = None,
                            local_evaluation: bool = False,
                            client_data: tff.Computation | None = None
                            ) -> tff.templates.IterativeProcess:
  """Builds the baseline of `plan` (see the module docstring).

  `next(state, client_data, client_states) -> (state, client_states, metrics)` with the
  same client states and metrics as PFLEGO's process, so the same driver runs both.
  `local_evaluation`: client_data is OrderedDict(train=..., test=...) and each client
  reports its local model's test metrics (`build_averaging_client_work`).
  `client_data`: optional TFF computation client id -> client data; given, `next`
  takes client ids (`composition.with_client_data`).
  """
  types = common.model_types(body_fn, image_shape, max_classes,
                             personal_body=plan.personal_mu is not None)
  shared_type = shared_weights_type(types, plan.shared_head)
  feature_dim = types.feature_dim

  distributor = tff.learning.templates.build_broadcast_process(shared_type)
  aggregator = aggregators.NonFiniteRejectionFactory(
      tff.aggregators.MeanFactory(no_nan_division=True)).create(
          shared_type.trainable, tff.TensorType(np.float32))
  if server_optimizer is None:  # averaging: w - 1.0 * mean(w - w_i) = mean(w_i)
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      server_optimizer, shared_type)

  client_work = build_averaging_client_work(body_fn, plan, types, local_evaluation)

  @tff.tensorflow.computation
  def initial_model():
    body = tff.learning.models.ModelWeights.from_model(body_fn())
    if not plan.shared_head:
      return body
    limit = 1.0 / np.sqrt(feature_dim)
    init = tf.keras.initializers.RandomUniform(-limit, limit, seed=seed)
    return tff.learning.models.ModelWeights(
        trainable=list(body.trainable) + [init((feature_dim, max_classes)),
                                          init((max_classes,))],
        non_trainable=list(body.non_trainable))

  return composition.compose_process(AveragingState, initial_model, distributor,
                                    client_work, aggregator, finalizer,
                                    client_work.type_signature.parameter[1],
                                    types.client_state, client_data)


PLAN_NAMES = ("fedavg", "fedprox", "fedper", "fedrep", "fedbabu", "ditto", "fedrecon")


def paper_plan(name: str, local_steps: int, client_lr: float, prox_mu: float = 0.25,
               body_steps: int = 5, momentum: float = 0.9) -> AveragingPlan:
  """The plan of baseline `name` (spec section 4)."""
  if name in ("fedavg", "fedprox"):
    return AveragingPlan((LocalPhase("both", local_steps, client_lr),), shared_head=True,
                         prox_mu=prox_mu if name == "fedprox" else 0.0)
  if name == "fedper":
    return AveragingPlan((LocalPhase("both", local_steps, client_lr),))
  if name == "fedrep":
    head_steps = max(local_steps - body_steps, 0)
    return AveragingPlan((LocalPhase("head", head_steps, client_lr),
                          LocalPhase("body", min(body_steps, local_steps), client_lr)))
  if name == "fedbabu":
    return AveragingPlan((LocalPhase("body", body_steps, client_lr, momentum),))
  if name == "ditto":  # the global model as FedAvg, plus each personal model
    return AveragingPlan((LocalPhase("both", local_steps, client_lr),), shared_head=True,
                         personal_mu=prox_mu)
  if name == "fedrecon":
    return AveragingPlan((LocalPhase("head", local_steps, client_lr),), send_gradient=True)
  raise ValueError(f"unknown averaging baseline {name!r}; one of {PLAN_NAMES}")


def orthogonal_head(feature_dim: int, max_classes: int, seed: int
                    ) -> collections.OrderedDict:
  """FedBabu's fixed head: orthonormal columns (QR of a seeded Gaussian), zero bias."""
  rng = np.random.default_rng([seed, 4242])
  q, _ = np.linalg.qr(rng.standard_normal((feature_dim, max_classes)))
  return collections.OrderedDict(kernel=q.astype(np.float32),
                                 bias=np.zeros(max_classes, np.float32))


def body_weights(state: AveragingState, num_body_trainable: int,
                 shared_head: bool) -> tff.learning.models.ModelWeights:
  return split_shared(state.model, num_body_trainable, shared_head)[0]
