"""Partition schemes through the real data path, and a run replayed on another run's
partition file."""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from tff_pflego.data import federated, load_federated_data
from tff_pflego.experiment import ExperimentConfig, run_experiment


def _checkpoint(output_dir: str) -> dict[str, np.ndarray]:
  root = os.path.join(output_dir, "checkpoints")
  last = max(os.listdir(root), key=lambda name: int(name.split("_")[-1]))
  reader = tf.train.load_checkpoint(os.path.join(root, last, "variables", "variables"))
  return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
          if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}


def test_a_run_on_another_runs_partition_file_reproduces_its_numbers(data_dir, tmp_path):
  common = dict(dataset="fashion_mnist", personalization="high", clients_per_round=3,
                rounds=3, local_steps=3, data_dir=data_dir, progress=False, seed=0)
  first_dir, replay_dir = str(tmp_path / "first"), str(tmp_path / "replay")
  first = run_experiment(ExperimentConfig(output_dir=first_dir, num_clients=6,
                                          partition="dirichlet", dirichlet_alpha=0.5,
                                          **common))
  manifest = os.path.join(first_dir, "partition.json")
  replay = run_experiment(ExperimentConfig(output_dir=replay_dir, partition_file=manifest,
                                           **common))

  assert first["partition"] == {"partition": "dirichlet", "dirichlet_alpha": 0.5}
  assert replay["partition"] == {"partition": "file",
                                 "partition_file": os.path.abspath(manifest)}
  assert replay["final"] == first["final"]  # bit for bit, every metric
  first_tensors, replay_tensors = _checkpoint(first_dir), _checkpoint(replay_dir)
  assert first_tensors.keys() == replay_tensors.keys()
  for name, value in first_tensors.items():
    # The run fingerprint names its manifest's, which says how the split was made.
    if "elapsed" not in name and "fingerprint" not in name:
      np.testing.assert_array_equal(replay_tensors[name], value, err_msg=name)
  with open(manifest) as f, open(os.path.join(replay_dir, "partition.json")) as g:
    assert json.load(f)["clients"] == json.load(g)["clients"]  # the same split, served
  assert first["final"]["test_accuracy_mean"] > 0.3  # it trained on real data


def test_schemes_give_their_partitions_and_record_them(data_dir):
  balanced = load_federated_data("fashion_mnist", "high", 10, seed=1, data_dir=data_dir)
  independent = load_federated_data(
      "fashion_mnist", "high", 10, seed=1, data_dir=data_dir,
      scheme=federated.PartitionScheme(class_assignment="independent"))
  assert independent.provenance["partition_scheme"] == {
      "partition": "classes", "class_assignment": "independent"}
  assert balanced.provenance["partition_scheme"]["class_assignment"] == "balanced"
  assert independent.manifest_path != balanced.manifest_path
  holders = lambda d: np.bincount(np.concatenate(d.partition.class_sets), minlength=10)
  assert np.all(holders(balanced) == 2)  # 10 clients x 2 classes over 10 classes
  assert np.all(holders(independent) >= 1) and np.any(holders(independent) != 2)
  for data in (balanced, independent):  # the served labels are the manifest's classes
    for i in (0, 7):
      _, y = data.client_arrays(i, "test")
      assert set(y.tolist()) <= set(range(len(data.partition.class_sets[i])))
