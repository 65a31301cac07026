"""Federated algorithms as TFF iterative processes: one module per algorithm.

`api` holds the interface (`AlgorithmConfig`, `PersonalizedAlgorithm`), `registry` the
one mapping name -> `build`. Nothing is imported here, so that the data layer can use
`api` without loading every algorithm.
"""
