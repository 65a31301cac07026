"""The reproduction grid's tables: merging invocations, seeds, shortened cells, leads."""

from __future__ import annotations

import math

import pytest

from tff_pflego.training import grid


def _row(algorithm, seed, accuracy, degree="high", rounds=200, std=0.001, **extra):
  return dict(dataset="mnist", degree=degree, algorithm=algorithm, seed=seed,
              rounds=rounds, paper_rounds=200, accuracy_mean=accuracy,
              accuracy_std=std, run_dir=f"runs/{algorithm}/seed{seed}", **extra)


def test_results_round_trip_and_a_later_invocation_keeps_other_cells(tmp_path):
  path = str(tmp_path / "results.csv")
  fields = ["dataset", "degree", "algorithm", "seed", "rounds", "paper_rounds",
            "accuracy_mean", "accuracy_std", "refit_mean", "run_dir"]
  first = [_row("pflego", 0, 0.9, refit_mean=None), _row("fedavg", 0, 0.8, refit_mean=0.7)]
  grid.write_results(path, first, fields)
  read = grid.read_results(path)
  assert read == first  # ints stay ints, empty stays None, text stays text

  rerun = _row("fedavg", 0, 0.85, refit_mean=0.75)
  merged = grid.merge(read, [rerun, _row("fedper", 0, 0.88, refit_mean=None)])
  assert [(r["algorithm"], r["accuracy_mean"]) for r in merged] == [
      ("pflego", 0.9), ("fedavg", 0.85), ("fedper", 0.88)]


def test_seeds_give_the_mean_and_the_sample_std():
  accuracies = [0.90, 0.92, 0.97]
  rows = [_row("pflego", seed, a) for seed, a in enumerate(accuracies)]
  summary = grid.summarize(rows, "mnist", "high", "pflego", "accuracy")
  mean = sum(accuracies) / 3
  sample_std = math.sqrt(sum((a - mean) ** 2 for a in accuracies) / 2)
  assert summary.n == 3 and summary.mean == pytest.approx(mean, abs=1e-15)
  assert summary.std == pytest.approx(sample_std, abs=1e-15)
  assert summary.seed_std == summary.std

  one = grid.summarize(rows[:1], "mnist", "high", "pflego", "accuracy")
  assert (one.n, one.std, one.seed_std) == (1, 0.001, None)  # the run's own window std
  assert grid.summarize(rows, "mnist", "medium", "pflego", "accuracy") is None


def test_a_shortened_cell_is_flagged_and_never_averaged_with_a_full_one():
  rows = [_row("fedavg", 0, 0.70, rounds=50), _row("fedavg", 1, 0.90)]
  full = grid.summarize(rows, "mnist", "high", "fedavg", "accuracy")
  assert (full.n, full.mean, full.shortened) == (1, 0.90, False)
  short = grid.summarize(rows[:1], "mnist", "high", "fedavg", "accuracy")
  assert (short.rounds, short.shortened) == (50, True)


def test_the_lead_is_over_the_best_full_length_baseline_against_the_seed_std():
  rows = ([_row("pflego", s, a) for s, a in enumerate([0.95, 0.96, 0.97])]
          + [_row("fedper", 0, 0.93), _row("fedrecon", 0, 0.955),
             _row("fedavg", 0, 0.99, rounds=50)])  # best, but shortened: not compared
  found = grid.lead(rows, "mnist", "high", "accuracy", ["fedavg", "fedper", "fedrecon"])
  assert found.best_baseline == "fedrecon"
  assert found.lead == pytest.approx(0.96 - 0.955, abs=1e-12)
  assert found.noise == pytest.approx(0.01, abs=1e-12)  # sample std of .95 .96 .97
  assert found.verdict == "ahead within the seed std (1.00)"

  rows[3]["accuracy_mean"] = 0.98  # fedper now best, by more than the noise
  found = grid.lead(rows, "mnist", "high", "accuracy", ["fedavg", "fedper", "fedrecon"])
  assert found.best_baseline == "fedper" and found.lead == pytest.approx(-0.02)
  assert found.verdict == "behind by more than the seed std (1.00)"

  alone = grid.lead(rows[3:4] + rows[:1], "mnist", "high", "accuracy", ["fedper"])
  assert alone.noise is None and "one seed" in alone.verdict
  assert grid.lead(rows[5:], "mnist", "high", "accuracy", ["fedavg"]).best_baseline is None


def test_largest_rise_is_the_worst_climb_above_the_best_so_far():
  assert grid.largest_rise([0.7, 0.5, 0.4, 0.3]) == 1.0
  assert grid.largest_rise([0.7, 0.58, 1.2, 0.8, 4.49, 0.6]) == pytest.approx(4.49 / 0.58)
  assert grid.largest_rise([0.7, 0.9, 0.2, 0.3]) == pytest.approx(0.3 / 0.2)


def test_a_ceiling_counts_only_on_its_partition_and_by_the_current_recipe(tmp_path):
  import json
  import types
  from tff_pflego.errors import UserError
  from tff_pflego.training import ceiling
  run = tmp_path / "run"
  run.mkdir()
  (run / "partition.json").write_text(json.dumps({"partition_fingerprint": "abc"}))
  assert ceiling.read_ceiling(str(run)) is None  # none computed
  computed = {"partition_fingerprint": "abc", "best_test_accuracy_mean": 0.9,
              **ceiling.RECIPE}
  (run / "ceiling.json").write_text(json.dumps(computed))
  assert ceiling.read_ceiling(str(run))["best_test_accuracy_mean"] == 0.9
  for name in ceiling.RECIPE:  # e.g. one computed before the heads' warm-up existed
    (run / "ceiling.json").write_text(json.dumps({**computed, name: None}))
    assert ceiling.read_ceiling(str(run)) is None
  (run / "ceiling.json").write_text(json.dumps(computed))
  (run / "partition.json").write_text(json.dumps({"partition_fingerprint": "xyz"}))
  assert ceiling.read_ceiling(str(run)) is None  # the run's partition changed: stale
  other = types.SimpleNamespace(provenance={"partition_fingerprint": "abc"})
  with pytest.raises(UserError, match="no ceiling computed on another partition"):
    ceiling.write_ceiling(str(run), other, seed=0, epochs=1)


def test_the_most_specific_note_explains_a_cell():
  notes = {("fedrep", "all"): "any dataset", ("mnist", "fedrep", "all"): "mnist",
           ("mnist", "none", "fedrep", "all"): "mnist none"}
  assert grid.note_for(notes, "mnist", "none", "fedrep", "all") == "mnist none"
  assert grid.note_for(notes, "mnist", "high", "fedrep", "all") == "mnist"
  assert grid.note_for(notes, "cifar10", "none", "fedrep", "all") == "any dataset"
  assert grid.note_for(notes, "cifar10", "none", "fedrep", "sampled") is None


def test_the_legend_names_each_algorithm_once_with_its_seeds_per_degree():
  assert grid.legend_label("fedper", {"high": 1, "medium": 1, "none": 1}) == "fedper"
  assert grid.legend_label("pflego", {"high": 5, "none": 5}) == "pflego (5 seeds)"
  assert (grid.legend_label("ditto", {"high": 5, "medium": 1, "none": 1})
          == "ditto (5 seeds at High)")
  assert (grid.legend_label("fedavg", {"high": 1, "medium": 3, "none": 5})
          == "fedavg (3 seeds at Medium, 5 seeds at None)")
  assert (grid.legend_label("fedavg", {"high": 1}, shortened_rounds=50)
          == "fedavg (shortened: T=50)")


def test_a_runs_partition_is_read_from_its_summary_then_its_manifest_then_its_record(
    tmp_path):
  import json
  from tff_pflego import records
  run = str(tmp_path)
  assert records.partition_fingerprint(run) is None
  (tmp_path / "record.json").write_text(json.dumps({"partition_fingerprint": "kept"}))
  assert records.partition_fingerprint(run) == "kept"  # a record of an old summary
  (tmp_path / "partition.json").write_text(json.dumps({"partition_fingerprint": "manifest"}))
  assert records.partition_fingerprint(run) == "manifest"  # an unfinished run
  (tmp_path / "summary.json").write_text(json.dumps({"data_provenance": {}}))
  assert records.partition_fingerprint(run) == "manifest"  # a summary without one
  (tmp_path / "summary.json").write_text(
      json.dumps({"data_provenance": {"partition_fingerprint": "trained"}}))
  assert records.partition_fingerprint(run) == "trained"  # what the run trained on
