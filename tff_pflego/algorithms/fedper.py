"""FedPer (Arivazhagan et al. 2019): a shared body, personal heads.

Client i: tau full-batch GD steps at rate beta on l_i(theta, W_i), body and its own head
together, from (theta_t, W_i); the head stays with the client, the body is averaged:
theta_{t+1} = sum_S N_i theta_i / sum_S N_i.
"""

from __future__ import annotations

from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan, LocalPhase,
                                             builder)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("both", config.local_steps, config.client_lr),))


build = builder("fedper", plan)
