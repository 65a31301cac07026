"""FedBabu (Oh et al. 2022): only the body is trained; the head is fixed.

Every client's head is the same orthonormal matrix (QR of a seeded Gaussian, zero bias)
and is never trained. Client i: s = `body_steps` full-batch heavy-ball steps on the
body, m <- momentum m + grad, theta <- theta - beta m (momentum 0.9); the body is
averaged as in FedPer.
"""

from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from tff_pflego.algorithms import averaging
from tff_pflego.algorithms.averaging import (AlgorithmConfig, AveragingPlan,
                                             ClientDataComputations, LocalPhase,
                                             PersonalizedAlgorithm)


def plan(config: AlgorithmConfig) -> AveragingPlan:
  return AveragingPlan(
      (LocalPhase("body", config.body_steps, config.client_lr, config.momentum),))


def orthogonal_head(feature_dim: int, max_classes: int, seed: int
                    ) -> collections.OrderedDict:
  """The fixed head: orthonormal columns (QR of a seeded Gaussian), zero bias."""
  rng = np.random.default_rng([seed, 4242])
  q, _ = np.linalg.qr(rng.standard_normal((feature_dim, max_classes)))
  return collections.OrderedDict(kernel=q.astype(np.float32),
                                 bias=np.zeros(max_classes, np.float32))


def build(config: AlgorithmConfig,
          client_data: Optional[ClientDataComputations] = None) -> PersonalizedAlgorithm:
  algorithm = averaging.build_baseline("fedbabu", plan(config), config, client_data)
  head = orthogonal_head(algorithm.types.feature_dim, algorithm.types.max_classes,
                         config.seed)
  return averaging.with_first_state(
      algorithm, lambda state: collections.OrderedDict(state, head=head))
