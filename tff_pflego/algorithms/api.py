"""What an algorithm is to the rest of the project: its configuration in, one object out.

Every algorithm module exposes

    build(config: AlgorithmConfig,
          client_data: ClientDataComputations | None = None) -> PersonalizedAlgorithm

and the registry maps its name to that function. The returned object declares all the
driver, evaluation, checkpoints and export need to know (its process, its client state
and how evaluation reads it), so none of them tests an algorithm's name or a key of its
client state.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Optional

import tensorflow_federated as tff

from tff_pflego.algorithms.model_types import BodyFn, ModelTypes
from tff_pflego.data.client_data import ClientDataComputations
from tff_pflego.models import build_body


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """Everything an algorithm's construction depends on. The settings' defaults and
  ranges are defined once, in `tff_pflego.settings`; this record carries their values."""
  body: str  # key into tff_pflego.models.BODIES
  image_shape: tuple
  max_classes: int
  total_examples: int  # N = sum_i N_i over all clients
  participation_prob: float  # q = r / I, or pi
  local_steps: int  # tau
  client_lr: float  # beta
  server_lr: float  # rho
  server_optimizer: str
  head_step: str
  head_optimizer: str
  seed: int
  prox_mu: float  # FedProx's and Ditto's mu
  body_steps: int  # FedRep's body-only steps, FedBabu's body steps
  momentum: float  # FedBabu's and FedRep's local heavy-ball momentum
  ascd_p_w: float  # ASCD-PFL: the body's probability
  ascd_momentum: float  # ASCD-PFL: c in x = c z + (1 - c) y
  ascd_z_step: float  # ASCD-PFL: gamma / eta
  # The reference code's protocol: each round's clients are scored right after their
  # update. The baselines' clients do it inside the round, on their locally trained
  # model; PFLEGO's local model (theta_{t-1}, new head) the driver rebuilds from states.
  sampled_eval: bool
  # The server rate's schedule over T = schedule_rounds rounds
  # (`server_optimizers.build_server_optimizer`); constant: the paper's fixed rho.
  server_lr_schedule: str
  server_lr_final_fraction: float
  schedule_rounds: int = 0  # T: read by a non-constant schedule only
  # The baselines' head-only phases on features computed once per phase: the same
  # numbers, fewer body passes (`local_training.LocalModel.train`).
  cache_head_features: bool = False

  def body_fn(self) -> BodyFn:
    """A no-argument function building the body with its seeded initial weights."""
    return functools.partial(build_body, self.body, self.image_shape, self.seed)


class ServerState(NamedTuple):
  """Every process's server state: the shared model and the composed stages' states.

  `model` is what the server broadcasts (PFLEGO and FedPer: the body's weights;
  FedAvg: the body's weights and the shared head as trailing trainable tensors).
  """
  model: tff.learning.models.ModelWeights
  distributor: Any
  aggregator: Any
  finalizer: Any
  round_num: Any


@dataclasses.dataclass(frozen=True)
class PersonalizedAlgorithm:
  """An iterative process `next(state, client_data, client_states)` and its helpers.

  Client states are `model_types.ModelTypes.client_state`: client index, K_i, the
  personal head, and with `personal_body` the client's own body (trainable weights).
  """
  name: str
  process: tff.templates.IterativeProcess
  body_fn: BodyFn
  types: ModelTypes
  # The body weights evaluation starts from: ServerState -> ModelWeights.
  body_weights: Callable[[ServerState], tff.learning.models.ModelWeights]
  # A client's state on its first visit: (client index, K_i) -> client state.
  initial_client_state: Callable[[int, int], Any]
  broadcast_type: Any  # what the server sends each client (for the cost ledger)
  update_type: Any  # what each client sends for aggregation, besides its weight N_i
  # The client states to evaluate with (FedAvg: each client's head := the shared one).
  evaluation_states: Callable[[ServerState, list], list] = lambda state, states: states
  # Client states hold a body of their own (`types.client_state.body`), which
  # evaluation uses instead of the shared body (Ditto, Local-only).
  personal_body: bool = False
  # Its clients score their local model on their test data inside the round:
  # client_data is OrderedDict(train, test) and the clients' metrics hold
  # test_accuracy and num_test (`averaging.build_client_work`).
  evaluates_in_round: bool = False
  # `next` takes client ids: each client builds its data in its client work.
  takes_client_ids: bool = False


Builder = Callable[[AlgorithmConfig, Optional[ClientDataComputations]],
                   PersonalizedAlgorithm]
