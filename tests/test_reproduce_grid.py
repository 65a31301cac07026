"""binaries/reproduce.py on a tiny grid: cells, seeds, ceilings, and tables that keep
what earlier invocations wrote, also on a fresh clone (the records under --docs_dir);
a stopped cell parked in its record continues on a fresh clone."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from tests.helpers import ENV, REPO, TIMING_COLUMNS, claim_in_another_process
from tff_pflego import records
from tff_pflego.config import PAPER_ACCURACY
from tff_pflego.training import ceiling as ceiling_lib
from tff_pflego.training import grid
from tff_pflego.training.release import read_rows

REPRODUCE = [sys.executable, os.path.join(REPO, "binaries", "reproduce.py")]


def _last_evaluations(run_dir: str, key: str) -> np.ndarray:
  rows = [r for r in read_rows(os.path.join(run_dir, "metrics.csv")) if r["round"] > 0]
  return np.array([r[key] for r in rows[-10:]])


def test_a_grid_tabulates_seeds_ceilings_and_keeps_earlier_rows(prepared, tmp_path):
  out = str(tmp_path / "grid")
  os.makedirs(out)
  earlier = dict(dataset="mnist", degree="high", algorithm="fedper", seed=0, rounds=200,
                 paper_rounds=200, accuracy_mean=0.5, accuracy_std=0.01,
                 run_dir="gone/with/the/machine")
  grid.write_results(os.path.join(out, "results.csv"), [earlier], list(earlier))
  args = ["--datasets=fashion_mnist", "--degrees=high", "--algorithms=pflego,fedavg",
          "--seeds=0,1", "--num_clients=5", "--rounds=3", "--eval_every=1",
          "--ceiling_epochs=2", f"--data_dir={prepared}", f"--output_dir={out}",
          f"--docs_dir={tmp_path / 'docs'}", "--noprogress"]
  first = subprocess.run(REPRODUCE + args, env=ENV, capture_output=True, text=True,
                         timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]

  rows = {(r["algorithm"], r["seed"]): r
          for r in grid.read_results(os.path.join(out, "results.csv"))
          if r["dataset"] == "fashion_mnist"}
  assert sorted(rows) == [("fedavg", 0), ("fedavg", 1), ("pflego", 0), ("pflego", 1)]
  per_seed = []
  for seed in (0, 1):
    run_dir = os.path.join(out, "fashion_mnist", "high", "pflego", f"seed{seed}_T3")
    row = rows[("pflego", seed)]
    record = os.path.join(tmp_path, "docs", "runs", "fashion_mnist", "high", "pflego",
                          f"seed{seed}_T3")
    assert row["run_dir"] == record and row["rounds"] == 3  # the copy a fresh clone has
    assert row["accuracy_mean"] == _last_evaluations(run_dir, "test_accuracy_mean").mean()
    rounds = read_rows(os.path.join(run_dir, "rounds.csv"))
    assert row["time_per_round_s"] == np.median([r["round_time_s"] for r in rounds])
    with open(os.path.join(run_dir, "ceiling.json")) as f:
      ceiling = json.load(f)
    with open(os.path.join(run_dir, "partition.json")) as f:
      assert ceiling["partition_fingerprint"] == json.load(f)["partition_fingerprint"]
    assert len(ceiling["curve"]) == 2 and row["ceiling_mean"] == max(ceiling["curve"])
    assert rows[("fedavg", seed)]["ceiling_mean"] is None
    per_seed.append(row["accuracy_mean"])

  with open(os.path.join(out, "results.md")) as f:
    table = f.read()
  mean, std = np.mean(per_seed), np.std(per_seed, ddof=1)
  paper = 100 * PAPER_ACCURACY[("fashion_mnist", "pflego", "high")]
  assert (f"| pflego | {100 * mean:.2f} ± {100 * std:.2f} [{paper:.2f}] (n=2) "
          "(shortened: T=3) | — | — |" in table)
  assert "- fashion_mnist/high/pflego (all clients, seed 0, shortened: T=3)" in table
  assert "## mnist: all clients" in table  # the earlier invocation's row survives
  assert "| fedper | 50.00 ± 1.00 | — | — |" in table
  assert os.path.exists(os.path.join(out, "fashion_mnist_curves.png"))

  again = subprocess.run(REPRODUCE + args, env=ENV, capture_output=True, text=True,
                         timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("done, skipped") == 4
  with open(os.path.join(out, "results.md")) as f:
    assert f.read() == table

  # A fresh clone: the runs are gone, docs/ (results.csv, the records) is in git.
  record = tmp_path / "docs" / "runs" / "fashion_mnist" / "high" / "pflego" / "seed1_T3"
  assert sorted(os.listdir(record)) == ["ceiling.json", "config.json", "metrics.csv.gz",
                                        "record.json", "rounds.csv.gz", "summary.json"]
  run_partition = os.path.join(out, "fashion_mnist", "high", "pflego", "seed1_T3",
                               "partition.json")
  assert json.loads((record / "record.json").read_text())["partition_fingerprint"] == (
      json.loads(open(run_partition).read())["partition_fingerprint"])
  shutil.rmtree(out)
  fresh = subprocess.run(REPRODUCE + args, env=ENV, capture_output=True, text=True,
                         timeout=900)
  assert fresh.returncode == 0, fresh.stderr[-3000:]
  assert fresh.stdout.count("done, skipped") == 4
  assert not os.path.exists(os.path.join(out, "fashion_mnist", "high"))  # nothing ran
  with open(os.path.join(out, "results.md")) as f:
    assert f.read() == table  # the ceilings, the seeds' rows and the earlier row
  assert os.path.exists(os.path.join(out, "fashion_mnist_curves.png"))


def _rows_without_timing(text: str) -> list[dict]:
  return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS}
          for row in csv.DictReader(io.StringIO(text))]


def test_a_stopped_cell_is_parked_and_ends_on_a_fresh_clone_as_an_uninterrupted_one(
    prepared, tmp_path):
  """SIGTERM mid-cell parks it in its record (newest checkpoint and logs), lists it in
  the docs' results.md and ends the grid; with the run directory gone (a fresh clone),
  the same command continues from the parked round and its record equals that of the
  cell run without a stop."""
  def args(name):
    return ["--datasets=fashion_mnist", "--degrees=high", "--algorithms=pflego",
            "--num_clients=5", "--rounds=6", "--eval_every=1", "--checkpoint_every=1",
            "--noceilings", f"--data_dir={prepared}", f"--output_dir={tmp_path / name}",
            f"--docs_dir={tmp_path / name / 'docs'}", "--noprogress"]

  straight = subprocess.run(REPRODUCE + args("straight"), env=ENV, capture_output=True,
                            text=True, timeout=900)
  assert straight.returncode == 0, straight.stderr[-3000:]

  cell = os.path.join("fashion_mnist", "high", "pflego", "seed0_T6")
  run, record = tmp_path / "stopped" / cell, tmp_path / "stopped" / "docs" / "runs" / cell
  # A second cell after it: the stop must end the grid, not only the cell.
  proc = subprocess.Popen(REPRODUCE + args("stopped") + ["--seeds=0,1"], env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 600
  while not (run / "checkpoints" / "round_2").exists():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-3000:]
  assert "[2/2]" not in out and not (run.parent / "seed1_T6").exists()
  parked_at = int(re.search(r"stopped at round (\d+): parked in ", out).group(1))
  assert 2 <= parked_at < 6 and not records.finished(str(record))
  assert f"checkpoints/round_{parked_at}/saved_model.pb" in records.parked_files(str(record))
  # The stopped invocation itself lists the parked cell in the docs' tables.
  assert (f"- fashion_mnist/high/pflego/seed0_T6: round {parked_at} of 6\n" in
          (tmp_path / "stopped" / "docs" / "results.md").read_text())

  shutil.rmtree(run)  # a fresh clone: the record is in git, the run is not
  again = subprocess.run(REPRODUCE + args("stopped"), env=ENV, capture_output=True,
                         text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"continuing the run parked in {record} at round {parked_at}" in again.stdout
  assert re.search(rf"^resuming from round {parked_at} of 6$", again.stdout, re.MULTILINE)
  reference = tmp_path / "straight" / "docs" / "runs" / cell
  for name in ("metrics.csv", "rounds.csv"):
    assert _rows_without_timing(records.read_text(str(record / name))) == (
        _rows_without_timing(records.read_text(str(reference / name)))), name
  summaries = [json.loads((d / "summary.json").read_text()) for d in (record, reference)]
  assert summaries[0]["final"] == summaries[1]["final"]
  assert not records.parked(str(record))
  assert "Unfinished" not in (tmp_path / "stopped" / "docs" / "results.md").read_text()


def test_a_cell_claimed_by_a_live_process_is_left_to_it(prepared, tmp_path):
  """Two invocations over one --output_dir: a cell another live process claims is
  skipped, not run twice; its claim is left as it is."""
  out = tmp_path / "grid"
  run = out / "fashion_mnist" / "high" / "pflego" / "seed0_T2"
  sleeper = claim_in_another_process(str(run))
  try:
    done = subprocess.run(
        REPRODUCE + ["--datasets=fashion_mnist", "--degrees=high", "--algorithms=pflego",
                     "--num_clients=5", "--rounds=2", f"--data_dir={prepared}",
                     f"--output_dir={out}", "--noprogress"],
        env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (f"[1/1] fashion_mnist/high/pflego/0: being run by process {sleeper.pid}, "
            "skipped") in done.stdout
    assert not run.exists()
    assert (run.parent / "seed0_T2.claim").read_text() == f"{sleeper.pid}\n"
  finally:
    sleeper.kill()


def test_a_failing_cell_is_named_and_the_grid_goes_on(prepared, tmp_path):
  """A cell that fails (here its run directory is a file) does not stop the grid: the
  next cell runs to its end, and the invocation exits 2 (the cell failed on the user's
  input) with one line naming the failed cell and why; what was there is left as it
  was."""
  out = tmp_path / "grid"
  blocked = out / "fashion_mnist" / "high" / "pflego" / "seed0_T2"
  blocked.parent.mkdir(parents=True)
  blocked.write_text("not a run")
  done = subprocess.run(
      REPRODUCE + ["--datasets=fashion_mnist", "--degrees=high", "--algorithms=pflego",
                   "--seeds=0,1", "--num_clients=5", "--rounds=2", "--noceilings",
                   f"--data_dir={prepared}", f"--output_dir={out}", "--noprogress"],
      env=ENV, capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.strip().splitlines()[-1] == (
      "error: 1 of 2 cells failed (the others ran): fashion_mnist/high/pflego/0 "
      f"(--output_dir {blocked} is a file, not a directory)")
  assert "Traceback" not in done.stderr
  assert "[1/2] fashion_mnist/high/pflego/0: failed: " in done.stdout
  assert records.finished(str(blocked.parent / "seed1_T2"))
  assert [(r["algorithm"], r["seed"]) for r in grid.read_results(
      str(out / "results.csv"))] == [("pflego", 1)]
  assert blocked.read_text() == "not a run"


def test_a_stop_during_the_ceiling_loses_no_run(prepared, tmp_path):
  """The finished cell's record is kept before its ceiling is computed: SIGTERM during
  the ceiling leaves a whole record without one, and the same command on a fresh clone
  (the run directory gone) runs nothing but the ceiling, into the record, unless another
  process claims the cell."""
  out, docs = tmp_path / "grid", tmp_path / "docs"
  cell = os.path.join("fashion_mnist", "high", "pflego", "seed0_T2")
  args = ["--datasets=fashion_mnist", "--degrees=high", "--algorithms=pflego",
          "--num_clients=5", "--rounds=2", f"--data_dir={prepared}", f"--output_dir={out}",
          f"--docs_dir={docs}", "--noprogress"]
  proc = subprocess.Popen(REPRODUCE + args + ["--ceiling_epochs=1000"], env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  seen = []
  while not any("central L(psi) ceiling: computing" in line for line in seen):
    seen.append(proc.stdout.readline())
    assert proc.poll() is None, "".join(seen) + proc.stderr.read()[-3000:]
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-3000:]
  record = docs / "runs" / cell
  assert records.finished(str(record)) and not (record / "ceiling.json").exists()

  shutil.rmtree(out)
  sleeper = claim_in_another_process(str(out / cell))  # its ceiling is another's work
  try:
    left = subprocess.run(REPRODUCE + args, env=ENV, capture_output=True, text=True,
                          timeout=300)
  finally:
    sleeper.kill()
  assert left.returncode == 0, left.stderr[-3000:]
  assert f"being run by process {sleeper.pid}, skipped" in left.stdout
  assert not (record / "ceiling.json").exists()
  again = subprocess.run(REPRODUCE + args + ["--ceiling_epochs=2"], env=ENV,
                         capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "[1/1] fashion_mnist/high/pflego/0: done, skipped" in again.stdout
  assert "central L(psi) ceiling: computing (2 epochs)" in again.stdout
  assert not (out / cell).exists()
  kept = ceiling_lib.read_ceiling(str(record))
  assert kept is not None and kept["epochs"] == 2


def test_a_kept_rows_cached_features_label_follows_its_run_not_the_row(tmp_path):
  """results.csv rows written before a fix keep their numbers, but whether head-only
  steps ran on cached features is re-derived from the run's summary.json (or its record
  under --docs_dir): the flag labels a row only where the algorithm has a head-only
  phase; a row whose run and record are both gone keeps what it says."""
  out, docs = tmp_path / "grid", tmp_path / "docs"
  def row(algorithm, cached):
    return dict(dataset="cifar10", degree="high", algorithm=algorithm, seed=0, rounds=50,
                paper_rounds=200, accuracy_mean=0.5, accuracy_std=0.01,
                head_features_cached=cached,
                run_dir=str(out / "cifar10" / "high" / algorithm / "seed0_T50"))
  rows = [row("fedper", 1), row("fedrep", 0), row("fedbabu", 1)]
  for kept, algorithm in ((out, "fedper"), (docs / "runs", "fedrep")):
    directory = kept / "cifar10" / "high" / algorithm / "seed0_T50"
    directory.mkdir(parents=True)
    (directory / "summary.json").write_text(
        json.dumps({"hyperparameters": dict(
            body="cifar_cnn", image_shape=[32, 32, 3], max_classes=2,
            total_examples=50000, local_steps=50, body_steps=5, client_lr=0.005,
            momentum=0.0, cache_head_features=True)}))
  grid.write_results(str(out / "results.csv"), rows, list(rows[0]))
  tables = subprocess.run(
      REPRODUCE + ["--tables_only", "--datasets=cifar10", "--degrees=high",
                   "--algorithms=fedper,fedrep,fedbabu", "--seeds=0", "--noceilings",
                   f"--output_dir={out}", f"--docs_dir={docs}", "--noprogress"],
      env=ENV, capture_output=True, text=True, timeout=300)
  assert tables.returncode == 0, tables.stderr[-3000:]
  cached = {r["algorithm"]: r["head_features_cached"]
            for r in grid.read_results(str(out / "results.csv"))}
  assert cached == {"fedper": 0, "fedrep": 1, "fedbabu": 1}
  labelled = re.findall(r"^\| cifar10/high/(\w+)/seed0 \(T=50\) .*\(head features cached\)",
                        (out / "results.md").read_text(), re.MULTILINE)
  assert sorted(labelled) == ["fedbabu", "fedrep"]
