"""binaries/refit_probe.py: its protocol row is the run's own last refit evaluation; its
clients' ages and Adam's last step against what the run's checkpoints hold."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.helpers import ENV, REPO, tiny_run
from tff_pflego.algorithms import server_optimizers
from tff_pflego.training.release import read_rows

PROBE = [sys.executable, os.path.join(REPO, "binaries", "refit_probe.py")]


def test_refit_probe_reproduces_the_runs_last_refit(prepared, tmp_path):
  run = str(tmp_path / "run")
  done = subprocess.run(tiny_run(prepared, run), env=ENV, capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  probe = subprocess.run(PROBE + [f"--run_dir={run}", "--steps=1,20",
                                  "--starts=stored,zero"],
                         env=ENV, capture_output=True, text=True, timeout=600)
  assert probe.returncode == 0, probe.stderr[-3000:]
  with open(os.path.join(run, "refit_probe.json")) as f:
    results = json.load(f)["results"]
  last = read_rows(os.path.join(run, "metrics.csv"))[-1]
  assert last["round"] == 2
  # tau - 1 = 1 step from the stored heads: the run's evaluation protocol at round 2.
  assert abs(results["stored/1"]["train_loss"] - last["train_loss_refit"]) < 1e-5
  assert abs(results["stored/1"]["test_accuracy_mean"]
             - last["test_accuracy_refit_mean"]) < 1e-6
  # The other rows are other refits (the comparison above can fail).
  assert results["zero/1"]["train_loss"] != results["stored/1"]["train_loss"]
  assert results["stored/20"]["train_loss"] < results["stored/1"]["train_loss"]


def test_refit_probe_refuses_a_directory_without_a_run(tmp_path):
  probe = subprocess.run(PROBE + [f"--run_dir={tmp_path}"], env=ENV, capture_output=True,
                         text=True, timeout=300)
  assert probe.returncode == 2
  errors = [l for l in probe.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and "holds no run" in errors[0] and "Traceback" not in probe.stderr


def _checkpoints(run: str, rounds: int, tmp_path):
  """Before round 1 and at the run's checkpoint of each round 1..`rounds` (each read
  alone): every client's head kernel (client -> kernel; before round 1 its initial
  head), and the checkpoint itself (None before round 1); and the run's algorithm and
  settings."""
  from tff_pflego import experiment, runtime
  from tff_pflego.training import checkpoints, driver
  config = experiment.load_run_config(run)
  prepared = experiment.prepare(config)
  data = prepared.data
  with runtime.local_execution_context():
    algorithm = experiment.training_algorithm(config.algorithm, prepared.algorithm_config)
    heads = [{i: algorithm.initial_client_state(i, int(data.num_classes[i]))["head"]
              ["kernel"] for i in range(data.num_clients)}]
    states = [None]
    for round_num in range(1, rounds + 1):
      name = f"{checkpoints.PREFIX}{round_num}"
      copy = tmp_path / f"at_round_{round_num}"
      shutil.copytree(os.path.join(run, driver.CHECKPOINT_DIR, name),
                      copy / driver.CHECKPOINT_DIR / name)
      state = driver.checkpoint_manager(algorithm, data, str(copy),
                                        prepared.fingerprint).load_latest()
      assert state.round_num == round_num
      heads.append(heads[-1] | {i: s["head"]["kernel"]
                                for i, s in state.client_states.items()})
      states.append(state)
  return heads, states, algorithm, prepared.algorithm_config


def test_staleness_ages_are_the_rounds_since_each_clients_last_report(prepared, tmp_path):
  """The probe's ages (its replay of the run's sampler) against the rounds in which each
  client's stored head changed, read from the run's checkpoint of every round; its
  stored-head losses against the run's own last per-client evaluation."""
  run, rounds = str(tmp_path / "run"), 3
  done = subprocess.run(tiny_run(prepared, run, rounds=rounds) + ["--checkpoint_every=1"],
                        env=ENV, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  probe = subprocess.run(PROBE + [f"--run_dir={run}", "--steps=1", "--starts=stored"],
                         env=ENV, capture_output=True, text=True, timeout=600)
  assert probe.returncode == 0, probe.stderr[-3000:]
  with open(os.path.join(run, "refit_probe.json")) as f:
    stale = json.load(f)["staleness"]
  assert os.path.exists(os.path.join(run, "refit_probe_staleness.png"))

  heads, checkpoints, algorithm, settings = _checkpoints(run, rounds, tmp_path)
  last = {}
  for round_num in range(1, rounds + 1):
    for client, kernel in heads[round_num].items():
      if not np.array_equal(kernel, heads[round_num - 1][client]):
        last[client] = round_num  # its head was refitted: it reported in this round
  expected = [rounds - last[i] if i in last else -1 for i in range(5)]
  assert stale["ages"] == expected
  assert len(set(expected)) > 1  # the clients differ in age: the comparison can fail

  with open(os.path.join(run, "clients.csv")) as f:
    evaluated = [float(row["train_loss"]) for row in csv.DictReader(f)]
  np.testing.assert_allclose(stale["train_loss"], evaluated, rtol=1e-5)
  assert sum(g["clients"] for g in stale["groups"]) == 5

  # Adam's last step, from the state after it, against the body's change in that round.
  for round_num in (2, 3):
    state = checkpoints[round_num].server_state
    steps = server_optimizers.adam_last_step(
        server_optimizers.adam_state(state.finalizer),
        server_optimizers.rate_at(settings, round_num - 1))
    before, after = (tf.nest.flatten(algorithm.body_weights(c.server_state))
                     for c in checkpoints[round_num - 1:round_num + 1])
    for step, old, new in zip(steps, before, after):
      np.testing.assert_allclose(np.asarray(new, np.float64) - old, step, atol=2e-8)
    assert max(np.abs(s).max() for s in steps) > 1e-4  # the body moved
