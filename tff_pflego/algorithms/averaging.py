"""The baselines (FedAvg, FedProx, FedPer, FedRep, FedBabu, Ditto, FedRecon) as one process.

They differ only in their `AveragingPlan`: which local phases a client runs
(`local_training.LocalPhase`) and whether the head is shared or personal.

  distributor   the shared weights w_t (the body theta, plus the head when it is shared)
                are broadcast to the sampled clients.
  client work   the client loads w_t (and its own head when the head is personal), runs
                the plan's phases of full-batch GD on
                  F_i = l_i + (mu/2) ||w - w_t||^2     (mu = 0 but for FedProx)
                and sends delta_i = w_t - w_i and N_i; a personal head stays with it.
  aggregator    weighted mean sum_S N_i delta_i / sum_S N_i; a delta holding NaN/Inf is
                rejected (`aggregators.ScreenedMeanFactory`).
  finalizer     w_{t+1} = w_t - mean delta = sum_S N_i w_i / sum_S N_i (SGD at rate 1).

Each baseline is its own module (`fedavg.py`, `fedprox.py`, `fedper.py`, `fedrep.py`,
`fedbabu.py`, `ditto.py`, `fedrecon.py`, `local_only.py`) holding its plan and the math
it states; this module is the machinery they share.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import aggregators
from tff_pflego.algorithms import composition, instrumentation, server_optimizers, stages
from tff_pflego.algorithms.api import (AlgorithmConfig, Builder, ClientDataComputations,
                                       PersonalizedAlgorithm, ServerState)
from tff_pflego.algorithms.local_training import LocalModel, LocalPhase
from tff_pflego.algorithms.model_types import (BodyFn, ModelTypes, initial_client_state,
                                               model_types, train_and_test_type)
from tff_pflego.models import assign_weights, heads
from tff_pflego.models.scoring import score_on_dataset


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
  # False (Local-only): nothing is shared; the phases train the client's own body and
  # head, kept in its state, and the client sends an empty update.
  shares_body: bool = True
  # Head-only phases on features computed once per phase (`LocalModel.train`): the
  # same numbers, fewer body passes than the algorithms as published.
  cache_head_features: bool = False

  @property
  def head_features_cached(self) -> bool:
    """Whether `cache_head_features` takes effect: some phase trains the head alone."""
    return self.cache_head_features and any(phase.head_alone for phase in self.phases)

  @property
  def personal_body(self) -> bool:
    """Whether client states hold a body of their own."""
    return self.personal_mu is not None or not self.shares_body


# What a client that shares nothing sends and receives: a tensor of zero elements
# (0 bytes). An empty structure would do as well, but TFF's compiler logs an error line
# for every TensorFlow computation without outputs.
NOTHING = np.zeros((0,), np.float32)


def shared_weights_type(types: ModelTypes, plan: AveragingPlan):
  """What the server holds and broadcasts: the body, [the head], or nothing."""
  if not plan.shares_body:
    return tff.types.to_type(tff.learning.models.ModelWeights(
        trainable=[tff.TensorType(np.float32, NOTHING.shape)], non_trainable=[]))
  if not plan.shared_head:
    return types.weights
  head = types.client_state.head
  return tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=list(types.weights.trainable) + [head.kernel, head.bias],
      non_trainable=list(types.weights.non_trainable)))


def split_shared(weights, num_body_trainable: int, shared_head: bool):
  """Shared weights -> (body ModelWeights, shared head or None); nothing shared gives
  an empty body."""
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
    if plan.shares_body:
      assign_weights(model.body, body_weights)
    else:
      _assign(model.variables_of("body"), client_state["body"])
    model.assign_head(shared_head if plan.shared_head else client_state["head"])
    timing = {}
    batch = instrumentation.load_full_batch(dataset, timing)
    x, y = batch["x"], batch["y"]
    mask = heads.class_mask(client_state["num_classes"], max_classes)
    # The metrics' loss is taken before training, outside the pass counter.
    loss, accuracy = heads.head_loss_and_accuracy(
        model.body(x, training=False), y, model.kernel, model.bias, mask)

    anchored = model.variables_of(
        "both" if plan.shared_head else "body" if plan.shares_body else "none")
    anchor = [tf.identity(v) for v in anchored]
    with tf.control_dependencies([loss, accuracy]):
      model.train(plan.phases, x, y, mask, plan.prox_mu, anchor, anchored,
                  plan.cache_head_features)
    if plan.send_gradient:
      body_vars = model.variables_of("body")
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(body_vars)
        local_loss, _ = model.loss_and_accuracy(x, y, mask)
      delta = tape.gradient(local_loss, body_vars)
    elif plan.shares_body:
      delta = [a - v.read_value() for a, v in zip(anchor, anchored)]
    else:
      delta = [tf.constant(NOTHING)]
    new_state = collections.OrderedDict(
        client_index=client_state["client_index"],
        num_classes=client_state["num_classes"],
        head=client_state["head"] if plan.shared_head else model.head)
    if not plan.shares_body:
      new_state["body"] = [v.read_value() for v in model.variables_of("body")]
    if plan.personal_mu is not None:
      with tf.control_dependencies(delta):
        _assign(model.variables_of("body"), client_state["body"])
        model.assign_head(client_state["head"])
      model.train(plan.phases, x, y, mask, plan.personal_mu, anchor,
                  model.variables_of("both"), plan.cache_head_features)
      new_state["head"] = model.head
      new_state["body"] = [v.read_value() for v in model.variables_of("body")]
    metrics = collections.OrderedDict(
        client_index=client_state["client_index"], loss=loss, accuracy=accuracy,
        num_examples=tf.cast(tf.shape(y)[0], tf.float32), **model.counter.counts(), **timing)
    return collections.OrderedDict(update=delta, update_weight=metrics["num_examples"],
                                   client_state=new_state, metrics=metrics)

  return update


def _assign(variables: list[tf.Variable], values) -> None:
  for variable, value in zip(variables, values):
    variable.assign(value)


def local_test_metrics(model: LocalModel, test_dataset: tf.data.Dataset,
                       client_state, max_classes: int) -> collections.OrderedDict:
  """The client's local model (its variables now) on its test data: the reference
  code's evaluation protocol, outside the pass counter and the client's timing."""
  mask = heads.class_mask(client_state["num_classes"], max_classes)
  loss, accuracy, num_test = score_on_dataset(
      model.body, test_dataset, dict(kernel=model.kernel, bias=model.bias), mask)
  return collections.OrderedDict(test_loss=loss, test_accuracy=accuracy,
                                 num_test=tf.cast(num_test, tf.float32))


def build_client_work(body_fn: BodyFn, plan: AveragingPlan, types: ModelTypes,
                      evaluate_in_round: bool = False) -> tff.Computation:
  """The client computation (shared weights, data, client state) -> client output.

  With `evaluate_in_round` the data is OrderedDict(train=dataset, test=dataset) and the
  metrics gain the local model's `test_loss`, `test_accuracy` and `num_test` right
  after the update (for Ditto: the personal model; FedRecon: the reconstructed head).
  """
  shared_type = shared_weights_type(types, plan)
  num_body_trainable = len(types.weights.trainable)
  data_type = train_and_test_type(types) if evaluate_in_round else types.dataset

  @tff.tensorflow.computation(shared_type, data_type, types.client_state)
  def client_work(shared, data, client_state):
    model = LocalModel(body_fn(initialize=False), instrumentation.BodyPassCounter(), types.feature_dim,
                       types.max_classes)
    update = instrumentation.timed(make_averaging_client_update(model, plan, types.max_classes,
                                                       num_body_trainable))
    if not evaluate_in_round:
      return tf.function(update)(shared, data, client_state)

    @tf.function
    def update_and_evaluate(shared, data, client_state):
      output = update(shared, data["train"], client_state)
      output["metrics"].update(local_test_metrics(model, data["test"], client_state,
                                                  types.max_classes))
      return output

    return update_and_evaluate(shared, data, client_state)

  return client_work


def build_averaging_process(body_fn: BodyFn, plan: AveragingPlan, *,
                            image_shape: tuple, max_classes: int, seed: int = 0,
                            server_optimizer: tff.learning.optimizers.Optimizer | None = None,
                            evaluate_in_round: bool = False,
                            client_data: tff.Computation | None = None
                            ) -> tff.templates.IterativeProcess:
  """Builds the baseline of `plan` (see the module docstring).

  `next(state, client_data, client_states) -> (state, client_states, metrics)` with the
  same client states and metrics as PFLEGO's process, so the same driver runs both.
  `evaluate_in_round`: client_data is OrderedDict(train=..., test=...) and each client
  reports its local model's test metrics (`build_client_work`).
  `client_data`: optional TFF computation client id -> client data; given, `next`
  takes client ids (`composition.with_client_data`).
  """
  types = model_types(body_fn, image_shape, max_classes,
                      personal_body=plan.personal_body)
  shared_type = shared_weights_type(types, plan)
  feature_dim = types.feature_dim

  distributor = stages.broadcast_distributor(shared_type)
  aggregator = aggregators.build_mean_aggregator(shared_type.trainable)
  if server_optimizer is None:  # averaging: w - 1.0 * mean(w - w_i) = mean(w_i)
    server_optimizer = tff.learning.optimizers.build_sgdm(learning_rate=1.0)
  finalizer = stages.optimizer_finalizer(
      server_optimizer, shared_type)

  client_work = build_client_work(body_fn, plan, types, evaluate_in_round)

  @tff.tensorflow.computation
  def initial_model():
    if not plan.shares_body:
      return tff.learning.models.ModelWeights(trainable=[tf.constant(NOTHING)],
                                              non_trainable=[])
    body = tff.learning.models.ModelWeights.from_model(body_fn())
    if not plan.shared_head:
      return body
    limit = 1.0 / np.sqrt(feature_dim)
    init = tf.keras.initializers.RandomUniform(-limit, limit, seed=seed)
    return tff.learning.models.ModelWeights(
        trainable=list(body.trainable) + [init((feature_dim, max_classes)),
                                          init((max_classes,))],
        non_trainable=list(body.non_trainable))

  return composition.compose_process(initial_model, distributor,
                                    client_work, aggregator, finalizer,
                                    client_work.type_signature.parameter[1],
                                    types.client_state, client_data)


def build_baseline(name: str, plan: AveragingPlan, config: AlgorithmConfig,
                   client_data: Optional[ClientDataComputations] = None
                   ) -> PersonalizedAlgorithm:
  """The baseline `name` running `plan` (each baseline module's `build` calls this)."""
  plan = dataclasses.replace(plan, cache_head_features=config.cache_head_features)
  body_fn = config.body_fn()
  personal_body = plan.personal_body
  types = model_types(body_fn, config.image_shape, config.max_classes,
                      personal_body=personal_body)
  optimizer = server_optimizers.from_config(config) if plan.send_gradient else None
  process = build_averaging_process(
      body_fn, plan, image_shape=config.image_shape, max_classes=config.max_classes,
      seed=config.seed, server_optimizer=optimizer,
      evaluate_in_round=config.sampled_eval,
      client_data=client_data and (client_data.train_and_test if config.sampled_eval
                                   else client_data.train))
  num_body = len(types.weights.trainable)
  shared = shared_weights_type(types, plan)
  initial = functools.partial(initial_client_state, feature_dim=types.feature_dim,
                              max_classes=types.max_classes, seed=config.seed)

  def evaluation_states(state: ServerState, states: list) -> list:
    if not plan.shared_head or personal_body:
      return states  # personal heads (Ditto: personal models) are evaluated as they are
    head = split_shared(state.model, num_body, True)[1]
    return [collections.OrderedDict(s, head=head) for s in states]

  return PersonalizedAlgorithm(
      name=name, process=process, body_fn=body_fn, types=types,
      body_weights=functools.partial(body_weights, num_body_trainable=num_body,
                                     shared_head=plan.shared_head),
      initial_client_state=initial, evaluation_states=evaluation_states,
      broadcast_type=shared, update_type=shared.trainable, personal_body=personal_body,
      evaluates_in_round=config.sampled_eval, takes_client_ids=client_data is not None)


def builder(name: str, plan: Callable[[AlgorithmConfig], AveragingPlan]) -> Builder:
  """The `build` of the baseline `name` whose `plan(config)` says what it runs."""

  def build(config: AlgorithmConfig,
            client_data: Optional[ClientDataComputations] = None
            ) -> PersonalizedAlgorithm:
    return build_baseline(name, plan(config), config, client_data)

  return build


def with_first_state(algorithm: PersonalizedAlgorithm,
                     adjust: Callable[[collections.OrderedDict], collections.OrderedDict]
                     ) -> PersonalizedAlgorithm:
  """`algorithm` whose clients' first states are `adjust`ed (FedBabu: the fixed head;
  Ditto: the personal body)."""
  initial = algorithm.initial_client_state

  def first_state(client_index: int, num_classes: int):
    return adjust(initial(client_index, num_classes))

  return dataclasses.replace(algorithm, initial_client_state=first_state)


def body_weights(state: ServerState, num_body_trainable: int,
                 shared_head: bool) -> tff.learning.models.ModelWeights:
  return split_shared(state.model, num_body_trainable, shared_head)[0]
