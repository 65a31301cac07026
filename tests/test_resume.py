"""Checkpoints: a run killed with SIGKILL and resumed ends exactly as an uninterrupted one,
whether it was killed after its first checkpoint or before; a run stopped during an
evaluation keeps the round it evaluated; the same command on a finished run says so and
changes nothing."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import ENV, TIMING_COLUMNS, tiny_run
from tff_pflego.experiment import training_settings
from tff_pflego.machine import this_machine

ROUNDS = 6


def _run_args(data_dir, output_dir):
  return tiny_run(data_dir, output_dir, rounds=ROUNDS) + ["--checkpoint_every=1"]


def _rows(path):
  with open(path, newline="") as f:
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS}
            for row in csv.DictReader(f)]


def _checkpoint_values(output_dir, round_num):
  """The checkpoint's values but the wall time it records."""
  module = tf.saved_model.load(os.path.join(output_dir, "checkpoints", f"round_{round_num}"))
  state = dict(module())
  assert "elapsed_s" in state
  del state["elapsed_s"]
  return [np.asarray(v.numpy() if hasattr(v, "numpy") else v)
          for v in tf.nest.flatten(state)]


@pytest.fixture(scope="module")
def straight(prepared, tmp_path_factory):
  """An uninterrupted run and what it printed."""
  out = tmp_path_factory.mktemp("straight") / "run"
  done = subprocess.run(_run_args(prepared, out), env=ENV, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return out, done


def _kill_when(args, ready, timeout=300):
  """Starts the run and SIGKILLs it as soon as `ready()` holds."""
  proc = subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  deadline = time.monotonic() + timeout
  while not ready():
    assert proc.poll() is None and time.monotonic() < deadline
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait(60)


def _assert_same_results(straight_dir, other_dir, rounds=ROUNDS):
  a = json.loads((straight_dir / "summary.json").read_text())
  b = json.loads((other_dir / "summary.json").read_text())
  assert a["final"] == b["final"]
  for name in ("metrics.csv", "rounds.csv", "clients.csv"):
    assert _rows(straight_dir / name) == _rows(other_dir / name), name
  assert [int(r["round"]) for r in _rows(other_dir / "rounds.csv")] == list(
      range(1, rounds + 1))
  values_a, values_b = (_checkpoint_values(d, rounds) for d in (straight_dir, other_dir))
  assert len(values_a) == len(values_b) > 10
  for x, y in zip(values_a, values_b):
    np.testing.assert_array_equal(x, y)


def _machines(run_dir) -> list[tuple]:
  """The summary's segments: first round, then the machine (`_here`'s fields)."""
  segments = json.loads((run_dir / "summary.json").read_text())["machines"]
  return [(s["first_round"], s["cpu"], tuple(s["extensions"]), s["cores"], s["tensorflow"],
           s["onednn_max_cpu_isa"]) for s in segments]


def _here() -> tuple:
  """This machine as the runs' subprocesses see it: CPU model (read here from
  /proc/cpuinfo; the extensions' parsing is `test_machine`'s), cores, TensorFlow, and
  the kernel limit the subprocesses' environment sets."""
  with open("/proc/cpuinfo") as f:
    cpu = next((line.split(":", 1)[1].strip() for line in f
                if line.startswith("model name")), "unknown CPU")
  return (cpu, this_machine().extensions, len(os.sched_getaffinity(0)), tf.__version__,
          ENV.get("ONEDNN_MAX_CPU_ISA"))


def test_sigkilled_run_resumes_to_the_uninterrupted_result(prepared, tmp_path, straight):
  killed = tmp_path / "killed"
  _kill_when(_run_args(prepared, killed),
             lambda: os.path.exists(killed / "checkpoints" / "round_3"))
  assert not (killed / "summary.json").exists()  # it really was cut short

  resumed = subprocess.run(_run_args(prepared, killed), env=ENV, capture_output=True,
                           text=True, timeout=600)  # same command: resumes by default
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  found = re.search(rf"^resuming from round ([3-{ROUNDS - 1}]) of {ROUNDS}$",
                    resumed.stdout, re.MULTILINE)
  assert found, resumed.stdout
  _assert_same_results(straight[0], killed)
  here = _here()
  assert _machines(straight[0]) == [(0,) + here]
  assert _machines(killed) == [(0,) + here, (int(found.group(1)) + 1,) + here]


def test_run_killed_before_its_first_checkpoint_restarts_by_itself(prepared, tmp_path,
                                                                   straight):
  killed = tmp_path / "killed"  # only the last round would be checkpointed
  args = tiny_run(prepared, killed, rounds=ROUNDS) + ["--checkpoint_every=0"]
  _kill_when(args, lambda: len(_rows(killed / "rounds.csv")
                               if (killed / "rounds.csv").exists() else []) >= 2)
  assert not os.path.exists(killed / "checkpoints") or not os.listdir(
      killed / "checkpoints")
  assert _rows(killed / "metrics.csv")  # rows were written, no checkpoint

  again = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "stopped before its first checkpoint: starting it again from round 0" in (
      again.stdout)
  _assert_same_results(straight[0], killed)
  assert _machines(killed) == [(0,) + _here()]  # the first start's is gone


def test_a_stop_during_an_evaluation_keeps_the_round_which_resuming_evaluates(
    prepared, tmp_path, monkeypatch, capsys):
  """A stop signal while round 2 is evaluated (raised here from the summary of its
  table, as SIGTERM's handler raises SystemExit(143) wherever the run is) checkpoints
  round 2, trained, not round 1; the same command evaluates round 2 before training
  round 3, and every output equals an uninterrupted run's."""
  from tff_pflego import experiment
  from tff_pflego.training import driver, evaluation

  def train(output_dir):
    run, algorithm = experiment.prepare_training(
        "fashion_mnist", "pflego", prepared, num_clients=5, clients_per_round=2,
        local_steps=2, seed=0)
    driver.train(algorithm, run.data, run.sampler, driver.RunConfig(
        rounds=3, output_dir=str(output_dir), eval_every=1, checkpoint_every=0,
        progress=False))

  train(tmp_path / "straight")
  summarize, evaluated = evaluation.summarize, []

  def stopped_in_round_2(table, population):
    evaluated.append(table)
    if len(evaluated) == 3:  # rounds 0, 1, 2
      raise SystemExit(143)
    return summarize(table, population=population)

  cut = tmp_path / "cut"
  monkeypatch.setattr(evaluation, "summarize", stopped_in_round_2)
  with pytest.raises(SystemExit):
    train(cut)
  monkeypatch.undo()
  assert os.listdir(cut / "checkpoints") == ["round_2"]
  assert [r["round"] for r in _rows(cut / "metrics.csv")] == ["0", "1"]
  assert [r["round"] for r in _rows(cut / "rounds.csv")] == ["1", "2"]

  capsys.readouterr()
  train(cut)
  assert "resuming at round 2 of 3: evaluating it first" in capsys.readouterr().out
  _assert_same_results(tmp_path / "straight", cut, rounds=3)


def test_same_command_on_a_finished_run_says_it_is_complete(prepared, straight):
  out, first = straight
  assert "final (mean of the last 6 evaluations; sampled clients: the last 6 rounds)" in (
      first.stdout)
  before = {name: (out / name).read_bytes() for name in ("metrics.csv", "rounds.csv")}
  again = subprocess.run(_run_args(prepared, out), env=ENV, capture_output=True,
                         text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.splitlines()[0] == (
      f"run already complete ({ROUNDS} rounds) in {out}: nothing to do; --overwrite to "
      "start again")
  assert {name: (out / name).read_bytes() for name in before} == before


def test_a_fingerprint_holds_the_settings_the_algorithm_trains_with():
  """A checkpoint's fingerprint leaves out what the algorithm ignores, so checkpoints
  written before a setting existed (or mattered) still resume, and keeps what it uses,
  so a run with another value refuses the checkpoint."""
  before = helpers.algorithm_config(momentum=0.9)  # every fingerprint held 0.9 once
  assert "momentum" not in training_settings(before, "pflego")
  assert "momentum" not in training_settings(before, "ditto")
  assert training_settings(before, "fedbabu")["momentum"] == 0.9
  fedrep = dataclasses.replace(before, momentum=0.5)
  assert training_settings(fedrep, "fedrep")["momentum"] == 0.5
  assert "server_lr_schedule" not in training_settings(before, "pflego")
  cosine = dataclasses.replace(before, server_lr_schedule="cosine", schedule_rounds=9)
  assert training_settings(cosine, "pflego")["schedule_rounds"] == 9
