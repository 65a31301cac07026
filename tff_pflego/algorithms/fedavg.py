"""FedAvg (McMahan et al. 2017): one shared model, body and head, averaged every round.

Client i: w_i <- tau full-batch GD steps at rate beta on l_i(w) from the broadcast w_t
(the head sized K_max and masked to the client's classes); the server's new model is
the weighted mean w_{t+1} = sum_S N_i w_i / sum_S N_i. Evaluation scores every client
with the shared head.
"""

from __future__ import annotations

from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan, LocalPhase,
                                             builder)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("both", config.local_steps, config.client_lr),), shared_head=True)


build = builder("fedavg", plan)
