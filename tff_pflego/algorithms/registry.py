"""What the driver needs of an algorithm, and how each algorithm is built by name."""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Optional

import tensorflow_federated as tff

from tff_pflego.algorithms import averaging, common, composition, pflego
from tff_pflego.models import build_body


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """Everything an algorithm's construction depends on."""
  body: str  # key into tff_pflego.models.BODIES
  image_shape: tuple
  max_classes: int
  total_examples: int
  participation_prob: float
  local_steps: int
  client_lr: float
  server_lr: float
  server_optimizer: str = "adam"
  head_step: str = "exact"
  head_optimizer: str = "monotone_gd"
  seed: int = 0
  prox_mu: float = 0.25  # FedProx
  body_steps: int = 5  # FedRep's body-only steps, FedBabu's body steps
  momentum: float = 0.9  # FedBabu
  # Each client evaluates its local model on its test data right after its update,
  # inside the round (the reference code's protocol). PFLEGO needs no such step: its
  # local model is (theta_{t-1}, new head), which the driver evaluates from the states.
  local_evaluation: bool = False


@dataclasses.dataclass(frozen=True)
class PersonalizedAlgorithm:
  """An iterative process `next(state, client_data, client_states)` and its helpers."""
  name: str
  process: tff.templates.IterativeProcess
  body_fn: common.BodyFn
  types: common.ModelTypes
  body_weights: Callable[[Any], tff.learning.models.ModelWeights]
  initial_client_state: Callable[[int, int], collections.OrderedDict]
  broadcast_type: Any  # what the server sends each client (for the cost ledger)
  update_type: Any  # what each client sends for aggregation, besides its weight N_i
  # The client states to evaluate with (FedAvg: each client's head := the shared one).
  evaluation_states: Callable[[Any, list], list] = lambda state, states: states
  # client_data is OrderedDict(train, test) and the clients' metrics hold the local
  # model's test_accuracy and num_test (`averaging.build_averaging_client_work`).
  local_evaluation: bool = False
  # `next` takes client ids: each client builds its data in its client work.
  takes_client_ids: bool = False


def _build_pflego(config: AlgorithmConfig,
                  client_data: Optional[composition.ClientDataComputations] = None
                  ) -> PersonalizedAlgorithm:
  body_fn = functools.partial(build_body, config.body, config.image_shape, config.seed)
  types = common.model_types(body_fn, config.image_shape, config.max_classes)
  process = pflego.build_pflego_process(
      body_fn, image_shape=config.image_shape, max_classes=config.max_classes,
      total_examples=config.total_examples,
      participation_prob=config.participation_prob, local_steps=config.local_steps,
      client_lr=config.client_lr, server_lr=config.server_lr,
      server_optimizer=config.server_optimizer, head_step=config.head_step,
      head_optimizer=config.head_optimizer,
      client_data=client_data and client_data.train)
  return PersonalizedAlgorithm(
      name="pflego", process=process, body_fn=body_fn, types=types,
      body_weights=pflego.body_weights,
      initial_client_state=functools.partial(
          _initial_client_state, types=types, seed=config.seed),
      broadcast_type=types.weights, update_type=types.weights.trainable,
      takes_client_ids=client_data is not None)


def _initial_client_state(client_index: int, num_classes: int, *,
                          types: common.ModelTypes, seed: int):
  return common.initial_client_state(client_index, num_classes, types.feature_dim,
                                     types.max_classes, seed)


def _build_averaging(name: str, config: AlgorithmConfig,
                     client_data: Optional[composition.ClientDataComputations] = None
                     ) -> PersonalizedAlgorithm:
  body_fn = functools.partial(build_body, config.body, config.image_shape, config.seed)
  types = common.model_types(body_fn, config.image_shape, config.max_classes,
                             personal_body=name == "ditto")
  plan = averaging.paper_plan(name, config.local_steps, config.client_lr, config.prox_mu,
                              config.body_steps, config.momentum)
  process = averaging.build_averaging_process(
      body_fn, plan, image_shape=config.image_shape, max_classes=config.max_classes,
      seed=config.seed, server_optimizer=common.build_server_optimizer(
          config.server_optimizer, config.server_lr) if plan.send_gradient else None,
      local_evaluation=config.local_evaluation,
      client_data=client_data and (client_data.train_and_test if config.local_evaluation
                                   else client_data.train))
  num_body = len(types.weights.trainable)
  shared = averaging.shared_weights_type(types, plan.shared_head)
  initial = functools.partial(_initial_client_state, types=types, seed=config.seed)
  if name == "fedbabu":  # every client starts from (and keeps) one orthogonal head
    fixed = averaging.orthogonal_head(types.feature_dim, types.max_classes, config.seed)
    initial = functools.partial(_with_head, initial, fixed)
  if name == "ditto":  # every personal model starts as the initial global body
    body = body_fn()
    initial = functools.partial(_with_body, initial,
                                [v.numpy() for v in body.trainable_variables])

  def evaluation_states(state, states):
    if not plan.shared_head or plan.personal_mu is not None:
      return states  # personal heads (Ditto: personal models) are evaluated as they are
    head = averaging.split_shared(state.model, num_body, True)[1]
    return [collections.OrderedDict(s, head=head) for s in states]

  return PersonalizedAlgorithm(
      name=name, process=process, body_fn=body_fn, types=types,
      body_weights=functools.partial(averaging.body_weights, num_body_trainable=num_body,
                                     shared_head=plan.shared_head),
      initial_client_state=initial, evaluation_states=evaluation_states,
      broadcast_type=shared, update_type=shared.trainable,
      local_evaluation=config.local_evaluation, takes_client_ids=client_data is not None)


def _with_head(initial_state_fn, head, client_index: int, num_classes: int):
  return collections.OrderedDict(initial_state_fn(client_index, num_classes), head=head)


def _with_body(initial_state_fn, body, client_index: int, num_classes: int):
  return collections.OrderedDict(initial_state_fn(client_index, num_classes), body=body)


ALGORITHMS: dict[str, Callable[..., PersonalizedAlgorithm]] = {
    "pflego": _build_pflego,
    **{name: functools.partial(_build_averaging, name) for name in averaging.PLAN_NAMES},
}


def build_algorithm(name: str, config: AlgorithmConfig,
                    client_data: Optional[composition.ClientDataComputations] = None
                  ) -> PersonalizedAlgorithm:
  """The algorithm `name`; with `client_data` (a TFF computation client id -> the
  client's data: a dataset, or OrderedDict(train, test) with `local_evaluation`), its
  `next` takes client ids and each client reads its data in its own computation."""
  if name not in ALGORITHMS:
    raise ValueError(f"unknown algorithm {name!r}; available: {', '.join(ALGORITHMS)}")
  return ALGORITHMS[name](config, client_data)
