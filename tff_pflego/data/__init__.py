"""Real datasets through TFDS, partitioned into personalized federated clients."""

from tff_pflego.data.federated import FederatedData, load_federated_data
from tff_pflego.data.partition import ClientPartition, partition_by_classes
from tff_pflego.data.sources import DATASETS, DatasetSpec, get_dataset_spec

__all__ = [
    "ClientPartition", "DATASETS", "DatasetSpec", "FederatedData",
    "get_dataset_spec", "load_federated_data", "partition_by_classes",
]
