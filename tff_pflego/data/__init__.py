"""Real datasets through TFDS, partitioned into personalized federated clients.

The names below load on first use (PEP 562), so that importing a light submodule
(`sources`, `partition`) does not start TensorFlow.
"""

import importlib

_EXPORTS = {
    "ClientPartition": "partition", "partition_by_classes": "partition",
    "DATASETS": "sources", "DatasetSpec": "sources", "get_dataset_spec": "sources",
    "FederatedData": "federated", "load_federated_data": "federated",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
