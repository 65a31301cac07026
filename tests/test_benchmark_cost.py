"""binaries/benchmark_cost.py --round_runtimes=sequential: an algorithm's round times
are kept as it ends and reused by a later invocation only when they were measured on
the same settings, data, rounds and machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers import ENV, REPO

BENCHMARK = [sys.executable, os.path.join(REPO, "binaries", "benchmark_cost.py"),
             "--mlp_rounds=0", "--conv4_rounds=0", "--mlp_round_rounds=1",
             "--conv4_round_rounds=0", "--round_runtimes=sequential"]


def _round_times(out: str) -> dict:
  with open(os.path.join(out, "benchmark_cost.json")) as f:
    return json.load(f)["mlp"]["round_time"]


def test_sequential_round_times_are_kept_and_checked(data_dir, tmp_path):
  out = str(tmp_path / "cost")
  args = BENCHMARK + [f"--data_dir={data_dir}", f"--output_dir={out}"]
  first = subprocess.run(args + ["--algorithms=pflego,fedavg"], env=ENV,
                         capture_output=True, text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]
  measured = _round_times(out)
  assert set(measured) == {"pflego", "fedavg"}

  # A kept file from another machine is measured again; the rest are kept.
  path = os.path.join(out, "round_time_mlp_pflego.json")
  with open(path) as f:
    kept = json.load(f)
  kept["key"]["machine"] = "another machine"
  with open(path, "w") as f:
    json.dump(kept, f)
  second = subprocess.run(args + ["--algorithms=pflego,fedavg,fedper"], env=ENV,
                          capture_output=True, text=True, timeout=900)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "fashion_mnist fedavg: kept from" in second.stdout
  assert "round_time_mlp_pflego.json: measured on other settings" in second.stdout
  assert "round 2/2 pflego" in second.stdout and "round 2/2 fedper" in second.stdout
  assert "round 2/2 fedavg" not in second.stdout
  now = _round_times(out)
  for field in ("median_s", "measured_at"):  # as first measured
    assert now["fedavg"][field] == measured["fedavg"][field]
  assert now["pflego"]["measured_at"] >= measured["pflego"]["measured_at"]
  assert now["fedavg"]["vs_reference"] == (now["fedavg"]["median_s"]
                                           / now["pflego"]["median_s"])
  with open(path) as f:
    assert json.load(f)["key"]["machine"] != "another machine"
