"""FedProx (Li et al. 2020): FedAvg whose local objective has a proximal term.

Client i: tau full-batch GD steps at rate beta on
    F_i(w) = l_i(w) + (mu/2) ||w - w_t||^2    (mu: `prox_mu`, 0.25 in the paper)
from the broadcast w_t; the server averages as FedAvg does.
"""

from __future__ import annotations

from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan, LocalPhase,
                                             builder)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("both", config.local_steps, config.client_lr),), shared_head=True,
      prox_mu=config.prox_mu)


build = builder("fedprox", plan)
