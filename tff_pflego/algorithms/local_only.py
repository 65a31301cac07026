"""Local-only: every client trains its own full model; nothing is communicated.

The fully personalized special case of the unified objective (UNIFIED.md eq. (5)): each
client minimizes its own l_i(theta_i, W_i) and the clients never interact. Client i, in
each round it takes part: tau full-batch GD steps at rate beta on its own body and head
(kept in its state, starting from the seeded initial body and its first head). The
server holds nothing, broadcasts nothing and receives nothing (`averaging.NOTHING`, a
tensor of 0 elements), so the cost ledger counts 0 bytes down and only the 4-byte
weight N_i up. A standard pFL floor:
what personalization achieves without federation.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional

import tensorflow_federated as tff

from tff_pflego.algorithms import averaging
from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan,
                                             ClientDataComputations, LocalPhase,
                                             PersonalizedAlgorithm)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("both", config.local_steps, config.client_lr),), shares_body=False)


def build(config: AlgorithmConfig,
          client_data: Optional[ClientDataComputations] = None) -> PersonalizedAlgorithm:
  algorithm = averaging.build_baseline("local_only", plan(config), config, client_data)
  body = algorithm.body_fn()
  initial = tff.learning.models.ModelWeights(
      trainable=[v.numpy() for v in body.trainable_variables],
      non_trainable=[v.numpy() for v in body.non_trainable_variables])
  algorithm = averaging.with_first_state(
      algorithm, lambda state: collections.OrderedDict(state, body=initial.trainable))
  # Evaluation loads a body's weights, then each client's own over them: with nothing
  # shared, the ones it starts from are the initial body's.
  return dataclasses.replace(algorithm, body_weights=lambda state: initial)
