"""ASVRCD-PFL (spec UNIFIED.md 2.3): accelerated, variance-reduced block CD.

x = theta1 z + theta2 v + (1 - theta1 - theta2) y; the sampled block's estimate is
(grad F_j(x) - grad F_j(v)) / p + G, the other block's G = grad F(v); y <- x - eta g,
z <- nu z + (1 - nu) x - gamma g; the reference point v <- y with probability rho,
and G recomputed on all data (a communication). Full gradients are true means
(the reference's 1/50-scaled G, defect B1, is not reproduced).
"""

from __future__ import annotations

from tff_pflego.unified import block_cd
from tff_pflego.unified.constants import StepParameters


def rule(params: StepParameters, frozen: bool = False) -> block_cd.BlockRule:
  del frozen  # every block steps every iteration (g = G when not sampled)
  return block_cd.BlockRule(eta=params.eta, p_w=params.p_w, momentum=True,
                            variance_reduced=True, theta1=params.theta1,
                            theta2=params.theta2, gamma=params.gamma, nu=params.nu,
                            rho=params.rho)


build = block_cd.builder("asvrcd_pfl", rule)
