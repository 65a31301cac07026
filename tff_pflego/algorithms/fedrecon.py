"""FedRecon (Singhal et al. 2021): reconstruct the personal head, then send a body gradient.

Client i: tau full-batch GD steps at rate beta on its head alone (body fixed at
theta_t), from its stored head; then it sends g_i = grad_theta l_i(theta_t, W_i) at the
reconstructed head. The server applies the weighted mean of the g_i with its optimizer
(Adam, rate rho): block-coordinate descent, not exact SGD.
"""

from __future__ import annotations

from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan, LocalPhase,
                                             builder)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("head", config.local_steps, config.client_lr),), send_gradient=True)


build = builder("fedrecon", plan)
