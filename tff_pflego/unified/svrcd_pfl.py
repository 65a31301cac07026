"""SVRCD-PFL (spec UNIFIED.md 2.4): ASVRCD-PFL without momentum, x = y:
y <- y - eta g with the variance-reduced estimate g; v <- y w.p. rho (a communication)."""

from __future__ import annotations

from tff_pflego.unified import block_cd
from tff_pflego.unified.constants import StepParameters


def rule(params: StepParameters, frozen: bool = False) -> block_cd.BlockRule:
  del frozen
  return block_cd.BlockRule(eta=params.eta, p_w=params.p_w, momentum=False,
                            variance_reduced=True, rho=params.rho)


build = block_cd.builder("svrcd_pfl", rule)
