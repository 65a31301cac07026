"""FedRep (Collins et al. 2021): personal heads first, then the shared body.

Client i: tau - s full-batch GD steps on its head W_i alone (body fixed), then s steps
on the body alone (head fixed), s = `body_steps` (5), both at rate beta; the body is
averaged as in FedPer, the head stays with the client. With `momentum` mu > 0 (default
0) each phase takes heavy-ball steps m <- mu m + grad, v <- v - beta m from m = 0, as
the reference code's FedRep does with its `--momentum`.
"""

from __future__ import annotations

from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan, LocalPhase,
                                             builder)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  head_steps = max(config.local_steps - config.body_steps, 0)
  return AveragingPlan(
      (LocalPhase("head", head_steps, config.client_lr, config.momentum),
       LocalPhase("body", min(config.body_steps, config.local_steps), config.client_lr,
                  config.momentum)))


build = builder("fedrep", plan)
