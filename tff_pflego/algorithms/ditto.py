"""Ditto (Li et al. 2021): a global FedAvg model and a personal model per client.

Client i: the global model w as in FedAvg (tau GD steps from w_t, averaged); then its
personal model v_i (its own body and head, kept in its state, starting as the initial
global model) takes the same tau steps on
    l_i(v) + (mu/2) ||v - w_t||^2    (mu = `prox_mu`: 0.25 / 0.5 / 1.0 by degree).
Evaluation scores every client's personal model.
"""

from __future__ import annotations

import collections
from typing import Optional

from tff_pflego.algorithms import averaging
from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan,
                                             ClientDataComputations, LocalPhase,
                                             PersonalizedAlgorithm)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("both", config.local_steps, config.client_lr),), shared_head=True,
      personal_mu=config.prox_mu)


def build(config: AlgorithmConfig,
          client_data: Optional[ClientDataComputations] = None) -> PersonalizedAlgorithm:
  algorithm = averaging.build_baseline("ditto", plan(config), config, client_data)
  body = [v.numpy() for v in algorithm.body_fn().trainable_variables]
  return averaging.with_first_state(
      algorithm, lambda state: collections.OrderedDict(state, body=body))
