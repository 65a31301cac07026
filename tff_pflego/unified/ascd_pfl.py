"""ASCD-PFL (spec UNIFIED.md 2.4): ASVRCD-PFL without control variates.

x = theta z + (1 - theta) y with theta = min(0.8, 1/eta); the sampled block steps with
g = grad F_j(x) / p: y <- x - eta g, z <- nu z + (1 - nu) x - gamma g (eta, gamma, nu
from ASVRCD's parameters). The block not sampled keeps y and z (`frozen`, the
reference code's variant, B7) or, lifted, steps with g = 0: y <- x, z <- nu z + (1-nu) x.
"""

from __future__ import annotations

from tff_pflego.unified import block_cd
from tff_pflego.unified.constants import StepParameters


def rule(params: StepParameters, frozen: bool = True) -> block_cd.BlockRule:
  return block_cd.BlockRule(eta=params.eta, p_w=params.p_w, momentum=True,
                            variance_reduced=False, frozen=frozen,
                            theta1=params.theta_ascd, gamma=params.gamma, nu=params.nu)


build = block_cd.builder("ascd_pfl", rule)
