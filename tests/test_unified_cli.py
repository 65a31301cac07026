"""binaries/train_unified.py and the real-data devices: what a user runs and gets."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.helpers import ENV, REPO, claim_in_another_process
from tff_pflego import records
from tff_pflego.training import cells
from tff_pflego.unified import real_data

TRAIN_UNIFIED = [sys.executable, os.path.join(REPO, "binaries", "train_unified.py")]


def _run(args: list[str]) -> subprocess.CompletedProcess:
  return subprocess.run(TRAIN_UNIFIED + args, env=ENV, capture_output=True, text=True,
                        timeout=600)


@pytest.mark.parametrize("args,message", [
    (["--dataset=mnist"], "--objective for real data must be one of"),
    (["--objective=ews"], "--objective for synthetic_mx2 is mx2, got 'ews'"),
    (["--p_w=1.5"], "--p_w must be in (0, 1), got 1.5"),
    (["--rounds=0"], "--rounds=0"),
    (["--algorithm=adam"], "--algorithm=adam: value should be one of"),
    (["--algorithm=asvrcd_pfl", "--devices_per_round=5"],
     "--devices_per_round: asvrcd_pfl needs every device in every round"),
    (["--devices_per_round=21"], "--devices_per_round must be in 1..20, got 21"),
    (["--dataset=mnist", "--objective=mx2", "--mt_alpha=2"],
     "--mt_alpha applies to --objective=mt2 only, got 'mx2'"),
    (["--dataset=mnist", "--objective=mt2", "--mt_alpha=0"], "--mt_alpha must be > 0"),
    (["--dataset=fashion_mnist", "--objective=mx2", "--classes_per_device=11"],
     "--classes_per_device must be in [1, 10] for fashion_mnist, got 11"),
])
def test_bad_input_is_one_line_exit_2(args, message, tmp_path):
  result = _run(args + [f"--output_dir={tmp_path}"])
  assert result.returncode == 2, result.stderr[-2000:]
  errors = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert os.listdir(tmp_path) == []


def test_a_run_writes_its_summary_and_curve(tmp_path):
  """20 communications of ASVRCD on synthetic MX2: summary.json holds the issue's
  names, and its relative suboptimality is (F - F*)/F* of its own numbers."""
  result = _run(["--algorithm=asvrcd_pfl", "--rounds=20", "--eval_every=10",
                 f"--output_dir={tmp_path}"])
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  final = summary["final"]
  assert summary["communications"] == 20
  assert final["relative_suboptimality"] == pytest.approx(
      (final["objective"] - final["optimum"]) / final["optimum"], rel=1e-5)
  assert 0 < final["relative_suboptimality"] < 1
  assert summary["step_parameters"]["p_w"] == pytest.approx(
      summary["constants"]["calL_w"] / (summary["constants"]["calL_w"]
                                        + summary["constants"]["calL_beta"]), rel=1e-5)
  with open(tmp_path / "metrics.csv") as f:
    rows = list(csv.DictReader(f))
  assert [int(r["round"]) for r in rows] == [0, 10, 20]
  # ASVRCD's round 0 computes G: n w- and n beta-gradients per device.
  assert float(rows[1]["w_gradients_per_device"]) >= 1000
  assert float(rows[-1]["relative_suboptimality"]) == final["relative_suboptimality"]
  assert os.listdir(tmp_path / "tensorboard")
  # The same command again keeps the finished run: one line, exit 2.
  before = (tmp_path / "summary.json").read_bytes()
  again = _run(["--algorithm=asvrcd_pfl", "--rounds=20", f"--output_dir={tmp_path}"])
  assert again.returncode == 2 and "already holds a run" in again.stderr
  assert "Traceback" not in again.stderr
  assert (tmp_path / "summary.json").read_bytes() == before


def test_real_data_devices(data_dir):
  """Fashion-MNIST, c = 3: each device holds 3 distinct classes, 100 train and 300 test
  examples of those classes only, train examples disjoint across devices; columns of
  the pooled training features have mean 0 before the unit-norm scaling, rows norm 1."""
  split = real_data.load("fashion_mnist", 3, num_devices=6, seed=1, data_dir=data_dir)
  data = split.data
  assert data.x.shape == (6, 100, 784) and data.test_x.shape == (6, 300, 784)
  for m in range(6):
    held = set(split.classes[m].tolist())
    assert len(held) == 3
    assert set(data.y[m].tolist()) == held and set(data.test_y[m].tolist()) <= held
    counts = np.bincount(data.y[m], minlength=10)[sorted(held)]
    assert counts.max() - counts.min() <= 1
  assert np.linalg.norm(data.x, axis=-1) == pytest.approx(1.0)
  rows = data.x.reshape(-1, 784)
  assert len({r.tobytes() for r in rows}) == len(rows)
  assert split.provenance["dataset_fingerprint"]
  # The local-model accuracy against numpy: argmax of x W + b per device, averaged.
  from tff_pflego.unified.objectives import Objective
  objective = Objective("mx2", "softmax", 6, 784, num_classes=10, penalty=0.5)
  betas = np.random.default_rng(0).normal(size=(6, objective.model_dim))
  want = np.mean([np.mean(np.argmax(data.test_x[m] @ betas[m].reshape(785, 10)[:-1]
                                    + betas[m].reshape(785, 10)[-1], 1) == data.test_y[m])
                  for m in range(6)])
  score = real_data.local_accuracy(objective, data)
  assert score(np.zeros(objective.global_dim), betas) == pytest.approx(want, abs=1e-12)


def test_reproduce_unified_is_resumable_and_tabulates_its_runs(tmp_path):
  """Two optimizers, 4 communications: the table's suboptimality is each summary's;
  a second invocation reruns nothing (summaries untouched) and redraws the figure."""
  script = os.path.join(REPO, "binaries", "reproduce_unified.py")
  args = [sys.executable, script, "--datasets=synthetic_mx2", "--heterogeneity=0.3",
          "--algorithms=ascd_pfl,l2sgd_plus", "--rounds=4", "--eval_every=2",
          "--devices_per_round=10", "--repetitions=2",
          f"--output_dir={tmp_path / 'runs'}", f"--docs_dir={tmp_path / 'docs'}"]
  first = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  problem = tmp_path / "runs" / "synthetic_mx2_sigma0.3"
  # Partial participation only where it is allowed (not L2SGD+).
  assert sorted(os.listdir(problem)) == ["ascd_pfl", "ascd_pfl_r10", "ascd_pfl_seed1",
                                         "l2sgd_plus", "l2sgd_plus_seed1"]
  summaries = {name: problem / name / "summary.json"
               for name in ("ascd_pfl", "l2sgd_plus", "ascd_pfl_r10")}
  stamps = {name: os.stat(path).st_mtime_ns for name, path in summaries.items()}
  table = (tmp_path / "docs" / "results.md").read_text()
  labels = dict(ascd_pfl="ascd_pfl", l2sgd_plus="l2sgd_plus",
                ascd_pfl_r10="ascd_pfl (r=10)")
  for name, path in summaries.items():
    value = json.loads(path.read_text())["final"]["relative_suboptimality"]
    assert f"| {labels[name]} | " in table and f"{value:.2e}" in table
  assert json.loads(summaries["ascd_pfl_r10"].read_text())["settings"][
      "devices_per_round"] == 10
  # Repetitions: seed 1 is another run, and the table gives the median over the seeds.
  seeds = [json.loads((problem / name / "summary.json").read_text())
           for name in ("l2sgd_plus", "l2sgd_plus_seed1")]
  assert [s["settings"]["seed"] for s in seeds] == [0, 1]
  finals = sorted(s["final"]["relative_suboptimality"] for s in seeds)
  assert finals[0] != finals[1]
  median = (finals[0] + finals[1]) / 2
  objectives = [s["final"]["objective"] for s in seeds]
  mean, std = sum(objectives) / 2, abs(objectives[0] - objectives[1]) / 2 ** 0.5
  assert (f"| l2sgd_plus | 2 | - | {median:.2e} [{finals[0]:.2e}, {finals[1]:.2e}] | "
          f"{mean:.6f} +- {std:.1e} |" in table)
  # The paper's view of the seeds: mean and sample std of F at every evaluation.
  bands = json.loads((tmp_path / "docs" / "synthetic_mx2_repetitions.json").read_text())
  band = next(b for b in bands if b["optimizer"] == "l2sgd_plus")
  curves = [[float(r["objective"]) for r in csv.DictReader(open(problem / name /
                                                                "metrics.csv"))]
            for name in ("l2sgd_plus", "l2sgd_plus_seed1")]
  assert band["seeds"] == 2 and band["rounds"] == [0, 2, 4]
  np.testing.assert_allclose(band["objective"]["mean"], np.mean(curves, axis=0),
                             rtol=1e-12)
  np.testing.assert_allclose(band["objective"]["std"],
                             np.abs(np.subtract(*curves)) / np.sqrt(2), rtol=1e-12)
  assert (tmp_path / "docs" / "synthetic_mx2_repetitions.png").stat().st_size > 10_000
  # A run cut short (metrics.csv, no summary.json, no record) is run again; the others
  # are read.
  cut = problem / "l2sgd_plus_seed1"
  (cut / "summary.json").unlink()
  record = tmp_path / "docs" / "runs" / "synthetic_mx2_sigma0.3" / "l2sgd_plus_seed1"
  assert gzip.decompress((record / "metrics.csv.gz").read_bytes()) == (
      cut / "metrics.csv").read_bytes()
  shutil.rmtree(record)
  second = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
  assert second.returncode == 0, second.stderr[-3000:]
  assert second.stdout.split("wrote")[0].count("communications") == 1
  assert "l2sgd_plus: 4 communications" in second.stdout
  assert (cut / "summary.json").exists()
  assert {n: os.stat(p).st_mtime_ns for n, p in summaries.items()} == stamps
  assert (tmp_path / "docs" / "synthetic_mx2.png").stat().st_size > 10_000
  # A fresh clone (no runs, the records in git): nothing runs, the same table.
  table = (tmp_path / "docs" / "results.md").read_text()
  shutil.rmtree(tmp_path / "runs")
  (tmp_path / "docs" / "results.md").unlink()
  third = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
  assert third.returncode == 0, third.stderr[-3000:]
  assert "communications" not in third.stdout.split("wrote")[0]
  assert (tmp_path / "docs" / "results.md").read_text() == table
  assert not (tmp_path / "runs" / "synthetic_mx2_sigma0.3").exists()


def _reproduce_unified():
  """binaries/reproduce_unified.py as a module (loaded once: it defines absl flags)."""
  if "reproduce_unified" not in sys.modules:
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "reproduce_unified", os.path.join(REPO, "binaries", "reproduce_unified.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
  return sys.modules["reproduce_unified"]


def _fake_run(run_dir, value=0.5):
  """What a finished run leaves: metrics.csv, then summary.json."""
  os.makedirs(run_dir, exist_ok=True)
  with open(os.path.join(run_dir, "metrics.csv"), "w") as f:
    f.write(f"round,objective\n0,1.0\n5,{value!r}\n")
  with open(os.path.join(run_dir, "summary.json"), "w") as f:
    json.dump(dict(value=value), f)


def test_run_cells_reruns_a_cell_cut_by_a_lost_worker_with_a_new_worker(tmp_path):
  """A finished cell is skipped; the worker dies during the second of two cells: a new
  context runs that cell again and the grid goes on; with no retries left it stops."""
  import contextlib
  from tff_pflego.errors import WorkerLostError
  module = _reproduce_unified()
  module.flags.FLAGS(["reproduce_unified", f"--output_dir={tmp_path}",
                      f"--docs_dir={tmp_path / 'docs'}"])
  try:
    cells = [module.Cell("synthetic_mx2", "mx2", 0.3, None, a)
             for a in ("ascd_pfl", "lsgd_pfl", "scd_pfl", "l2sgd_plus")]
    os.makedirs(cells[0].config().output_dir)
    open(os.path.join(cells[0].config().output_dir, "summary.json"), "w").close()
    runs, contexts, failures = [], [], {cells[2].run_name: 1}

    def run(config):
      name = os.path.basename(config.output_dir)
      runs.append((name, config.overwrite, len(contexts)))
      if failures.get(name):
        failures[name] -= 1
        raise WorkerLostError("the TFF worker (pid 1) exited with code -11")
      _fake_run(config.output_dir)

    @contextlib.contextmanager
    def context():
      contexts.append("open")
      yield
      contexts[-1] = "closed"

    module.run_cells(cells, run, context, retries=1)
    assert runs == [("lsgd_pfl", True, 1), ("scd_pfl", True, 1), ("scd_pfl", True, 2),
                    ("l2sgd_plus", True, 2)]
    assert contexts == ["open", "closed"]  # the first one ended by the worker's death
    # Each run it made is recorded (the one it found is recorded when collected).
    assert [os.path.exists(os.path.join(c.record_dir, "summary.json")) for c in cells] == [
        False, True, True, True]
    failures[cells[3].run_name] = 1
    os.remove(os.path.join(cells[3].config().output_dir, "summary.json"))
    shutil.rmtree(cells[3].record_dir)
    with pytest.raises(WorkerLostError):
      module.run_cells(cells, run, context, retries=0)
  finally:
    module.flags.FLAGS.unparse_flags()


def test_run_cells_leaves_cells_to_other_processes(tmp_path):
  """One output directory, several invocations: a cell claimed by a live process is
  skipped, one another process finished meanwhile is not run again, and a claim whose
  process is gone, or whose pid is alive but holds no lock, is taken over (and released
  after the run)."""
  import contextlib
  module = _reproduce_unified()
  module.flags.FLAGS(["reproduce_unified", f"--output_dir={tmp_path}",
                      f"--docs_dir={tmp_path / 'docs'}"])
  stale, held, finished_meanwhile, free, reused = [
      module.Cell("synthetic_mx2", "mx2", 0.3, None, a)
      for a in ("ascd_pfl", "lsgd_pfl", "scd_pfl", "l2sgd_plus", "svrcd_pfl")]
  claims = {c.run_name: c.config().output_dir + ".claim" for c in (stale, held, reused)}
  os.makedirs(os.path.dirname(claims["svrcd_pfl"]), exist_ok=True)
  with open(claims["svrcd_pfl"], "w") as f:
    f.write("1\n")  # a live pid (reused, say) that holds no claim: it is free
  gone = claim_in_another_process(stale.config().output_dir)
  gone.kill()  # dies holding the claim: the kernel frees it, the file stays
  gone.wait()
  sleeper = claim_in_another_process(held.config().output_dir)
  try:
    with open(claims["ascd_pfl"]) as f:
      assert int(f.read()) == gone.pid
    runs = []

    def run(config):
      runs.append(os.path.basename(config.output_dir))
      with open(config.output_dir + ".claim") as f:
        assert int(f.read()) == os.getpid()  # this process holds the cell it runs
      _fake_run(config.output_dir)
      _fake_run(finished_meanwhile.config().output_dir)  # as another invocation would

    module.run_cells([stale, held, finished_meanwhile, free, reused], run,
                     contextlib.nullcontext)
    assert runs == ["ascd_pfl", "l2sgd_plus", "svrcd_pfl"]
    assert not os.path.exists(claims["ascd_pfl"])  # released
    with open(claims["lsgd_pfl"]) as f:
      assert int(f.read()) == sleeper.pid  # another's claim is left alone
    assert not os.path.exists(os.path.join(held.config().output_dir, "summary.json"))
  finally:
    sleeper.kill()
    module.flags.FLAGS.unparse_flags()


def test_records_keep_a_run_byte_stable_and_read_back(tmp_path):
  """A record holds the run's summary and its metrics rows exactly; keeping it again
  writes the same bytes (records live in git)."""
  run_dir, record_dir = str(tmp_path / "run"), str(tmp_path / "record")
  _fake_run(run_dir, value=0.1 + 0.2)
  records.keep(run_dir, record_dir)
  assert records.finished(record_dir)
  assert sorted(os.listdir(record_dir)) == ["metrics.csv.gz", "summary.json"]
  with open(os.path.join(record_dir, "summary.json")) as f:
    assert json.load(f) == dict(value=0.1 + 0.2)
  assert records.read_metrics(record_dir) == [dict(round=0.0, objective=1.0),
                                              dict(round=5.0, objective=0.1 + 0.2)]
  assert records.read_metrics(record_dir) == records.read_metrics(run_dir)
  packed = (tmp_path / "record" / "metrics.csv.gz").read_bytes()
  assert packed[4:8] == bytes(4)  # gzip's MTIME field (RFC 1952): no timestamp
  os.utime(os.path.join(run_dir, "metrics.csv"), (1, 1))
  records.keep(run_dir, record_dir)
  assert (tmp_path / "record" / "metrics.csv.gz").read_bytes() == packed


def test_a_parked_run_unpacks_to_the_same_files_and_its_bytes_are_stable(tmp_path):
  """An unfinished run parked in its record: only the asked paths, unpacked with the
  same contents; parking again after the files' times change writes the same bytes;
  the record of the finished run replaces the parked one."""
  run = tmp_path / "run"
  (run / "checkpoints" / "round_3" / "variables").mkdir(parents=True)
  (run / "checkpoints" / "round_2").mkdir()
  contents = {"metrics.csv": b"round,objective\n0,1.0\n",
              "checkpoints/round_3/saved_model.pb": bytes(range(256)) * 3,
              "checkpoints/round_3/variables/data": b"\x00\x01weights",
              "checkpoints/round_2/saved_model.pb": b"older", "tff_worker.log": b"noise"}
  for name, data in contents.items():
    (run / name).write_bytes(data)
  record = tmp_path / "record"
  facts = dict(round=3, rounds=9)
  assert records.park(str(run), str(record), ("metrics.csv", "checkpoints/round_3",
                                              "absent"), facts)
  assert records.parked(str(record)) and not records.finished(str(record))
  kept = sorted(["metrics.csv", "checkpoints/round_3/saved_model.pb",
                 "checkpoints/round_3/variables/data"])
  assert sorted(records.parked_files(str(record))) == kept
  assert records.parked_file(str(record), "metrics.csv") == contents["metrics.csv"]
  packed = (record / records.UNFINISHED).read_bytes()
  assert packed[4:8] == bytes(4)
  for name in contents:
    os.utime(run / name, (7, 7))
  records.park(str(run), str(record), ("metrics.csv", "checkpoints/round_3"), facts)
  assert (record / records.UNFINISHED).read_bytes() == packed
  elsewhere = tmp_path / "fresh_clone_run"
  records.unpark(str(record), str(elsewhere))
  assert {name: (elsewhere / name).read_bytes() for name in kept} == {
      name: contents[name] for name in kept}
  assert not (elsewhere / "tff_worker.log").exists()
  _fake_run(str(run), value=1.0)
  records.keep(str(run), str(record))
  assert not records.parked(str(record)) and records.finished(str(record))


def test_a_run_too_large_to_archive_is_noted_in_its_record_and_stays_in_place(tmp_path):
  """A parked run whose gzipped archive exceeds the budget: no archive (an earlier,
  smaller one is removed), unfinished.json holds the facts, where the run stays and the
  archive's true gzipped size; within the budget again the archive replaces the note;
  the finished run's record removes both."""
  run, record = tmp_path / "run", tmp_path / "record"
  (run / "checkpoints" / "round_1").mkdir(parents=True)
  (run / "checkpoints" / "round_1" / "small").write_bytes(b"x")
  paths = ("checkpoints",)
  assert records.park(str(run), str(record), paths, dict(round=1, rounds=4))
  state = np.random.default_rng(0).bytes(4000)  # incompressible: ~4000 bytes gzipped
  (run / "checkpoints" / "round_2").mkdir()
  (run / "checkpoints" / "round_2" / "weights").write_bytes(state)
  assert records.park(str(run), str(record), paths, dict(round=2, rounds=4))
  packed = (record / records.UNFINISHED).read_bytes()  # the archive within the budget
  assert len(packed) > 4000
  assert not records.park(str(run), str(record), paths, dict(round=2, rounds=4),
                          max_bytes=3000)
  assert sorted(os.listdir(record)) == [records.PARKED_LOCALLY]
  assert records.parked_locally(str(record)) == dict(
      round=2, rounds=4, kept_in=str(run), max_bytes=3000, archive_bytes=len(packed))
  assert not records.parked(str(record)) and not records.finished(str(record))
  assert cells.parked_state(str(record)) == (
      f"round 2 of 4, its state (0 MiB gzipped) too large for its record (at most 0 "
      f"MiB): only the machine holding `{run}` continues it")
  assert records.park(str(run), str(record), paths, dict(round=2, rounds=4),
                      max_bytes=len(packed))  # the budget is inclusive
  assert sorted(os.listdir(record)) == [records.UNFINISHED]
  assert (record / records.UNFINISHED).read_bytes() == packed
  assert not records.park(str(run), str(record), paths, dict(round=2, rounds=4),
                          max_bytes=3000)
  _fake_run(str(run), value=1.0)
  records.keep(str(run), str(record))
  assert sorted(os.listdir(record)) == ["metrics.csv.gz", "summary.json"]
  assert cells.parked_state(str(record)) is None


def test_an_archive_over_its_budget_never_reaches_the_disk(tmp_path):
  """Parking a ~40 KB incompressible state under a 4000-byte budget in a process whose
  files may not exceed 8 KiB (RLIMIT_FSIZE: a nearly full disk) notes the run with the
  archive's true gzipped size, the size of the archive written without the cap."""
  run, record = tmp_path / "run", tmp_path / "record"
  (run / "checkpoints" / "round_2").mkdir(parents=True)
  (run / "checkpoints" / "round_2" / "weights").write_bytes(
      np.random.default_rng(1).bytes(40000))
  script = (
      "import resource, signal, sys\n"
      "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
      "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))\n"
      "from tff_pflego import records\n"
      "sys.exit(records.park(sys.argv[1], sys.argv[2], ('checkpoints',),\n"
      "                      dict(round=2, rounds=4), max_bytes=4000))\n")
  capped = subprocess.run([sys.executable, "-c", script, str(run), str(record)],
                          env=ENV, cwd=REPO, capture_output=True, text=True)
  assert capped.returncode == 0, capped.stderr  # park returned False: not archived
  assert sorted(os.listdir(record)) == [records.PARKED_LOCALLY]
  uncapped = tmp_path / "uncapped"
  assert records.park(str(run), str(uncapped), ("checkpoints",), dict(round=2, rounds=4))
  size = (uncapped / records.UNFINISHED).stat().st_size
  assert size > 40000 and records.parked_locally(str(record))["archive_bytes"] == size


def test_a_run_parked_too_large_elsewhere_is_refused_not_started_over(tmp_path,
                                                                     monkeypatch):
  """unfinished.json notes round 2 of 4 kept on another machine: a run directory with
  no checkpoint, or an older one, is refused (UserError naming the round and the note,
  run_cell never called, the note kept); one holding that round continues."""
  from tff_pflego.errors import UserError
  record, run = tmp_path / "record", tmp_path / "run"
  record.mkdir()
  (record / records.PARKED_LOCALLY).write_text(json.dumps(dict(
      round=2, rounds=4, kept_in="/elsewhere/run", archive_bytes=9, max_bytes=1)))
  ran = []
  monkeypatch.setattr(cells, "run_cell", lambda config: (ran.append(config),
                                                         _fake_run(config.output_dir)))
  config = types.SimpleNamespace(output_dir=str(run))
  with pytest.raises(UserError) as refused:
    cells.run_or_continue(config, str(record))
  assert str(refused.value) == (
      f"the run was parked at round 2 of 4 in `/elsewhere/run` (too large for its "
      f"record) and `{run}` holds no checkpoint of it: continue it on the machine "
      f"holding that directory, or delete {record / records.PARKED_LOCALLY} to start "
      f"it over")
  (run / "checkpoints" / "round_1").mkdir(parents=True)
  (run / "checkpoints" / "round_1" / "weights").write_bytes(b"1")
  with pytest.raises(UserError, match="holds round 1 only"):
    cells.run_or_continue(config, str(record))
  assert ran == [] and records.parked_locally(str(record))["round"] == 2
  (run / "checkpoints" / "round_2").mkdir()
  (run / "checkpoints" / "round_2" / "weights").write_bytes(b"2")
  cells.run_or_continue(config, str(record))
  assert ran == [config] and records.finished(str(run))


def test_claims_table_compares_the_optimizers_per_problem():
  """Hand-made curves: ASCD reaches LSGD's final 0.08 at communication 6 of 8 (0.05),
  LSGD's final is 4x ASCD's 0.02, ASVRCD's 0.005 is a quarter of it; a problem without
  ASVRCD is left out, as is a variant or a second seed."""
  module = _reproduce_unified()

  def rows(values):
    return [dict(round=float(2 * i), relative_suboptimality=v) for i, v in enumerate(values)]

  def run(algorithm, values, problem_classes=2, **variant):
    cell = module.Cell("mnist", "mx2", None, problem_classes, algorithm, **variant)
    return cell, (dict(final=dict(relative_suboptimality=values[-1])), rows(values))

  results = dict([
      run("lsgd_pfl", [1.0, 0.5, 0.2, 0.1, 0.08]),
      run("ascd_pfl", [1.0, 0.3, 0.09, 0.05, 0.02]),
      run("asvrcd_pfl", [1.0, 0.3, 0.05, 0.01, 0.005]),
      run("ascd_pfl", [1.0, 1.0, 1.0, 1.0, 1.0], p_w=0.5),
      run("ascd_pfl", [1.0, 1.0, 1.0, 1.0, 1.0], seed=1),
      run("lsgd_pfl", [1.0, 0.5], problem_classes=4),
      run("ascd_pfl", [1.0, 0.7], problem_classes=4)])
  (claim,) = module.claims_rows(results)
  assert claim["problem"] == "mnist_mx2_c2" and claim["communications"] == 8
  assert claim["ascd_reaches_lsgd_final"] == 6
  assert claim["ascd_speedup"] == pytest.approx(8 / 6)
  assert claim["lsgd_over_ascd"] == pytest.approx(4.0)
  assert claim["asvrcd_over_ascd"] == pytest.approx(0.25)
