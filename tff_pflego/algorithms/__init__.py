"""Federated algorithms as TFF iterative processes, with what the driver needs of them."""

from tff_pflego.algorithms.registry import (ALGORITHMS, AlgorithmConfig,
                                            PersonalizedAlgorithm, build_algorithm)

__all__ = ["ALGORITHMS", "AlgorithmConfig", "PersonalizedAlgorithm", "build_algorithm"]
