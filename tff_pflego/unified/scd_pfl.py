"""SCD-PFL (spec UNIFIED.md 2.4): block <- block - (eta / p_b) grad_b F_j, for the
sampled block b only; no momentum, no control variates."""

from __future__ import annotations

from tff_pflego.unified import block_cd
from tff_pflego.unified.constants import StepParameters


def rule(params: StepParameters, frozen: bool = True) -> block_cd.BlockRule:
  del frozen  # without momentum, a block with g = 0 does not move either way
  return block_cd.BlockRule(eta=params.eta, p_w=params.p_w, momentum=False,
                            variance_reduced=False)


build = block_cd.builder("scd_pfl", rule)
