"""Model-averaging baselines (FedAvg, FedProx, FedPer, FedRep, FedBabu) as one process.

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
"""

from __future__ import annotations

import collections
import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import aggregators
from tff_pflego.algorithms import common
from tff_pflego.algorithms.local_training import LocalModel, LocalPhase
from tff_pflego.models import heads


@dataclasses.dataclass(frozen=True)
class AveragingPlan:
  phases: tuple[LocalPhase, ...]
  shared_head: bool = False
  prox_mu: float = 0.0


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
    batch = common.full_batch(dataset)
    x, y = batch["x"], batch["y"]
    mask = heads.class_mask(client_state["num_classes"], max_classes)
    # The metrics' loss is taken before training, outside the pass counter.
    loss, accuracy = heads.head_loss_and_accuracy(
        model.body(x, training=False), y, model.kernel, model.bias, mask)

    anchored = model.variables_of("both" if plan.shared_head else "body")
    anchor = [tf.identity(v) for v in anchored]
    with tf.control_dependencies([loss, accuracy]):
      model.train(plan.phases, x, y, mask, plan.prox_mu, anchor, anchored)
    delta = [a - v.read_value() for a, v in zip(anchor, anchored)]
    new_state = collections.OrderedDict(
        client_index=client_state["client_index"],
        num_classes=client_state["num_classes"],
        head=client_state["head"] if plan.shared_head else model.head)
    metrics = collections.OrderedDict(
        client_index=client_state["client_index"], loss=loss, accuracy=accuracy,
        num_examples=tf.cast(tf.shape(y)[0], tf.float32), **model.counter.counts())
    return collections.OrderedDict(update=delta, update_weight=metrics["num_examples"],
                                   client_state=new_state, metrics=metrics)

  return update


def build_averaging_client_work(body_fn: common.BodyFn, plan: AveragingPlan,
                                types: common.ModelTypes) -> tff.Computation:
  """The client computation (shared weights, dataset, client state) -> client output."""
  shared_type = shared_weights_type(types, plan.shared_head)
  num_body_trainable = len(types.weights.trainable)

  @tff.tensorflow.computation(shared_type, types.dataset, types.client_state)
  def client_work(shared, dataset, client_state):
    model = LocalModel(body_fn(), common.BodyPassCounter(), types.feature_dim,
                       types.max_classes)
    update = make_averaging_client_update(model, plan, types.max_classes,
                                          num_body_trainable)
    return tf.function(common.timed(update))(shared, dataset, client_state)

  return client_work


def build_averaging_process(body_fn: common.BodyFn, plan: AveragingPlan, *,
                            image_shape: tuple, max_classes: int, seed: int = 0
                            ) -> tff.templates.IterativeProcess:
  """Builds the baseline of `plan` (see the module docstring).

  `next(state, client_data, client_states) -> (state, client_states, metrics)` with the
  same client states and metrics as PFLEGO's process, so the same driver runs both.
  """
  types = common.model_types(body_fn, image_shape, max_classes)
  shared_type = shared_weights_type(types, plan.shared_head)
  feature_dim = types.feature_dim

  distributor = tff.learning.templates.build_broadcast_process(shared_type)
  aggregator = aggregators.NonFiniteRejectionFactory(
      tff.aggregators.MeanFactory(no_nan_division=True)).create(
          shared_type.trainable, tff.TensorType(np.float32))
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(learning_rate=1.0), shared_type)

  client_work = build_averaging_client_work(body_fn, plan, types)

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

  @tff.federated_computation
  def initialize():
    return tff.federated_zip(AveragingState(
        model=tff.federated_eval(initial_model, tff.SERVER),
        distributor=distributor.initialize(), aggregator=aggregator.initialize(),
        finalizer=finalizer.initialize(),
        round_num=tff.federated_value(np.int32(0), tff.SERVER)))

  @tff.tensorflow.computation(np.int32)
  def increment(round_num):
    return round_num + 1

  @tff.federated_computation(initialize.type_signature.result,
                             tff.FederatedType(types.dataset, tff.CLIENTS),
                             tff.FederatedType(types.client_state, tff.CLIENTS))
  def next_fn(state, client_data, client_states):
    distributed = distributor.next(state.distributor, state.model)
    outputs = tff.federated_map(client_work,
                                (distributed.result, client_data, client_states))
    aggregated = aggregator.next(state.aggregator, outputs.update, outputs.update_weight)
    finalized = finalizer.next(state.finalizer, state.model, aggregated.result)
    new_state = tff.federated_zip(AveragingState(
        model=finalized.result, distributor=distributed.state,
        aggregator=aggregated.state, finalizer=finalized.state,
        round_num=tff.federated_map(increment, state.round_num)))
    train_metrics = tff.federated_zip(collections.OrderedDict(
        loss=tff.federated_mean(outputs.metrics.loss, outputs.update_weight),
        accuracy=tff.federated_mean(outputs.metrics.accuracy, outputs.update_weight),
        num_examples=tff.federated_sum(outputs.update_weight),
        num_clients=tff.federated_sum(tff.federated_value(np.int32(1), tff.CLIENTS)),
        rejected_updates=aggregated.measurements.rejected_updates,
        update_non_finite=finalized.measurements.update_non_finite))
    metrics = collections.OrderedDict(train=train_metrics, clients=outputs.metrics)
    return new_state, outputs.client_state, metrics

  return tff.templates.IterativeProcess(initialize, next_fn)


PLAN_NAMES = ("fedavg", "fedprox", "fedper", "fedrep", "fedbabu")


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
