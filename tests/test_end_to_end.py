"""PFLEGO trained on real Fashion-MNIST through the driver, outputs checked."""

from __future__ import annotations

import csv
import hashlib
import json
import os

from tff_pflego.data import sources
from tff_pflego.experiment import ExperimentConfig, run_experiment


def test_pflego_on_fashion_mnist_learns_far_above_chance(data_dir, tmp_path):
  out = str(tmp_path / "run")
  # run_experiment opens its own private worker; the session's context comes back after.
  summary = run_experiment(ExperimentConfig(
      dataset="fashion_mnist", personalization="high", num_clients=10,
      clients_per_round=5, rounds=12, local_steps=10, output_dir=out,
      data_dir=data_dir, progress=False))
  final = summary["final"]
  assert final["test_accuracy_mean"] > 0.85  # chance is 0.5 with K = 2
  assert final["test_accuracy_sampled_pooled"] > 0.85
  for key in ("test_accuracy_pooled", "test_accuracy_std", "test_accuracy_worst10",
              "train_loss"):
    assert key in final
  assert summary["dataset"] == "fashion_mnist" and summary["rounds"] == 12
  with open(os.path.join(out, "metrics.csv")) as f:
    rows = list(csv.DictReader(f))
  assert rows[0]["round"] == "0" and rows[-1]["round"] == "12"
  assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"]) / 2
  with open(os.path.join(out, "rounds.csv")) as f:
    rounds = list(csv.DictReader(f))
  assert {float(r["body_forward_passes"]) for r in rounds} == {1.0}
  assert {float(r["body_backward_passes"]) for r in rounds} == {1.0}
  assert {int(r["num_reports"]) for r in rounds} == {5}
  assert {int(r["rejected_updates"]) for r in rounds} == {0}
  assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
      "round_10", "round_12"]
  with open(os.path.join(out, "clients.csv")) as f:
    assert len(list(csv.DictReader(f))) == 10
  assert os.path.getsize(os.path.join(out, "curves.png")) > 10000
  assert os.listdir(os.path.join(out, "tensorboard"))
  assert json.load(open(os.path.join(out, "summary.json")))["final"] == final
  # The summary names the data it was computed on: the raw files' sha256 (hashed
  # here independently) and the prepared dataset's and partition's fingerprints.
  data = summary["data_provenance"]
  assert data["raw_files"] == {
      name: hashlib.sha256(open(os.path.join(sources.FASHION_MNIST_DEBIAN_DIR, name),
                                "rb").read()).hexdigest()
      for name in sources.get_dataset_spec("fashion_mnist").required_files}
  with open(summary["partition_manifest"]) as f:
    manifest = json.load(f)
  assert data["partition_fingerprint"] == manifest["partition_fingerprint"]
  assert data["dataset_fingerprint"] == manifest["provenance"]["dataset_fingerprint"]
