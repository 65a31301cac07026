"""Bad input, table-driven: one clear line, exit code 2, no traceback, nothing lost.

Every case runs the real binary. Cases that point at an existing run check that not a
byte of it changed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from typing import Callable

import pytest

from tests.helpers import ENV, TRAIN, run_recording_tensorflow, tiny_run

FASHION_RAW = "/usr/share/datasets/fashion-mnist"


@dataclasses.dataclass
class Case:
  name: str
  args: Callable[["Ctx"], list[str]]  # the command line, given the context
  message: str  # must appear in the single "error: " line
  protects_run: bool = False  # the case points at a finished run: it must be untouched
  setting: str = ""  # the setting (tff_pflego.settings) whose allowed values it breaks


@dataclasses.dataclass
class Ctx:
  tmp: str
  data_dir: str
  run_dir: str  # a private copy of a finished 2-round run with checkpoints

  def tiny(self, output_dir=None, **overrides) -> list[str]:
    args = tiny_run(self.data_dir, output_dir or os.path.join(self.tmp, "out"))
    return [a for a in args if a.split("=")[0] not in {f"--{k}" for k in overrides}] + [
        f"--{k}={v}" for k, v in overrides.items()]


def _truncated_raw_dir(ctx: Ctx) -> str:
  raw = os.path.join(ctx.tmp, "raw", "mnist")
  os.makedirs(raw)
  for name in os.listdir(FASHION_RAW):
    shutil.copy(os.path.join(FASHION_RAW, name), raw)
  with open(os.path.join(raw, "train-images-idx3-ubyte.gz"), "r+b") as f:
    f.truncate(100_000)
  return os.path.dirname(raw)


def _damaged_client_file(ctx: Ctx) -> str:
  data = os.path.join(ctx.tmp, "data")
  shutil.copytree(ctx.data_dir, data, symlinks=True)
  for root, _, files in os.walk(os.path.join(data, "tfds", "clients")):
    for name in files:
      if "client00001_train.tfrecord" in name:
        with open(os.path.join(root, name), "r+b") as f:
          f.truncate(1000)
  return data


def _corrupt_newest_checkpoint(ctx: Ctx) -> str:
  newest = os.path.join(ctx.run_dir, "checkpoints", "round_2", "variables")
  for name in os.listdir(newest):
    if name.startswith("variables.data"):
      with open(os.path.join(newest, name), "r+b") as f:
        f.truncate(10)
  return ctx.run_dir


def _a_file(ctx: Ctx) -> str:
  path = os.path.join(ctx.tmp, "a_file")
  with open(path, "w") as f:
    f.write("not a directory")
  return path


def _manifest(ctx: Ctx, edit: Callable[[dict], None] = lambda m: None,
              keep_fingerprint: bool = False) -> str:
  """The finished run's partition.json, edited, written beside the case."""
  with open(os.path.join(ctx.run_dir, "partition.json")) as f:
    manifest = json.load(f)
  edit(manifest)
  if not keep_fingerprint:
    manifest.pop("partition_fingerprint")
  path = os.path.join(ctx.tmp, "manifest.json")
  with open(path, "w") as f:
    json.dump(manifest, f)
  return path


def _clients(edit: Callable[[list], None]) -> Callable[[dict], None]:
  return lambda manifest: edit(manifest["clients"])


CASES = [
    Case("negative rounds", lambda c: c.tiny(rounds=-1),
         "--rounds=-1: -1 is not a positive integer", setting="rounds"),
    Case("rounds not a number", lambda c: c.tiny(rounds="many"), "--rounds"),
    Case("r > I", lambda c: c.tiny(clients_per_round=9), "--clients_per_round must be in"),
    Case("r = 0", lambda c: c.tiny(clients_per_round=0), "--clients_per_round=0",
         setting="clients_per_round"),
    Case("no clients", lambda c: c.tiny(num_clients=0), "--num_clients=0",
         setting="num_clients"),
    Case("unknown dataset", lambda c: c.tiny(dataset="imagenet"),
         "--dataset=imagenet: value should be one of", setting="dataset"),
    Case("unknown degree", lambda c: c.tiny(personalization="extreme"),
         "--personalization=extreme: value should be one of", setting="personalization"),
    Case("unknown algorithm", lambda c: c.tiny(algorithm="sgd"),
         "--algorithm=sgd: value should be one of", setting="algorithm"),
    Case("tau = 0", lambda c: c.tiny(local_steps=0), "--local_steps=0",
         setting="local_steps"),
    Case("negative rho", lambda c: c.tiny(server_lr=-1), "--server_lr must be > 0",
         setting="server_lr"),
    Case("zero beta", lambda c: c.tiny(client_lr=0), "--client_lr must be > 0",
         setting="client_lr"),
    Case("unknown server optimizer", lambda c: c.tiny(server_optimizer="rmsprop"),
         "--server_optimizer=rmsprop: value should be one of <adam|sgd>",
         setting="server_optimizer"),
    Case("unknown head step", lambda c: c.tiny(head_step="half"), "--head_step=half",
         setting="head_step"),
    Case("unknown head optimizer", lambda c: c.tiny(head_optimizer="adam"),
         "--head_optimizer=adam", setting="head_optimizer"),
    Case("negative seed", lambda c: c.tiny(seed=-1), "--seed=-1", setting="seed"),
    Case("pi > 1", lambda c: [a for a in c.tiny(participation_prob=1.5)
                              if not a.startswith("--clients_per_round")],
         "--participation_prob=1.5", setting="participation_prob"),
    Case("eval_clients = 0", lambda c: c.tiny(eval_clients=0), "--eval_clients=0",
         setting="eval_clients"),
    Case("negative mu", lambda c: c.tiny(prox_mu=-0.5), "--prox_mu=-0.5",
         setting="prox_mu"),
    Case("body_steps = 0", lambda c: c.tiny(body_steps=0), "--body_steps=0",
         setting="body_steps"),
    Case("momentum = 1", lambda c: c.tiny(momentum=1.0), "--momentum must be in [0, 1)",
         setting="momentum"),
    Case("ascd p_w = 1", lambda c: c.tiny(algorithm="ascd_pfl", ascd_p_w=1.0),
         "--ascd_p_w must be in (0, 1)", setting="ascd_p_w"),
    Case("unknown schedule", lambda c: c.tiny(server_lr_schedule="linear"),
         "--server_lr_schedule=linear: value should be one of <constant|cosine>",
         setting="server_lr_schedule"),
    Case("cosine schedule to 0", lambda c: c.tiny(server_lr_schedule="cosine",
                                                  server_lr_final_fraction=0.0),
         "--server_lr_final_fraction must be in (0, 1]",
         setting="server_lr_final_fraction"),
    Case("schedule for ascd", lambda c: c.tiny(algorithm="ascd_pfl",
                                               server_lr_schedule="cosine"),
         "--server_lr_schedule: ascd_pfl steps its body with its own coupled SGD"),
    Case("ascd momentum = 1", lambda c: c.tiny(algorithm="ascd_pfl", ascd_momentum=1.0),
         "--ascd_momentum must be in [0, 1)", setting="ascd_momentum"),
    Case("ascd z step = 0", lambda c: c.tiny(algorithm="ascd_pfl", ascd_z_step=0.0),
         "--ascd_z_step must be > 0", setting="ascd_z_step"),
    Case("r and pi together", lambda c: c.tiny(participation_prob=0.2),
         "At most one of (clients_per_round, participation_prob)"),
    Case("eval_every = 0", lambda c: c.tiny(eval_every=0), "--eval_every=0",
         setting="eval_every"),
    Case("dropout = 1", lambda c: c.tiny(dropout_prob=1.0), "--dropout_prob must be in",
         setting="dropout_prob"),
    Case("negative checkpoint_every", lambda c: c.tiny(checkpoint_every=-1),
         "--checkpoint_every=-1", setting="checkpoint_every"),
    Case("worker address without port", lambda c: c.tiny(workers="localhost"),
         "not a host:port address"),
    Case("no worker at the address", lambda c: c.tiny(workers="localhost:1"),
         "no TFF worker answers at localhost:1"),
    Case("resume and overwrite", lambda c: c.tiny() + ["--resume", "--overwrite"],
         "not both"),
    Case("positional argument", lambda c: c.tiny() + ["extra"], "unexpected positional"),
    Case("output dir not writable", lambda c: c.tiny(output_dir="/proc/forbidden"),
         "is not writable"),
    Case("output dir is a file", lambda c: c.tiny(_a_file(c)), "is a file, not a directory"),
    Case("export dir not writable", lambda c: c.tiny(export_dir="/proc/forbidden"),
         "--export_dir /proc/forbidden is not writable"),
    Case("raw dataset missing",
         lambda c: c.tiny(dataset="mnist", raw_data_dir=os.path.join(c.tmp, "nothing"),
                          data_dir=os.path.join(c.tmp, "fresh")),
         "expected raw file"),
    Case("raw dataset truncated",
         lambda c: c.tiny(dataset="mnist", raw_data_dir=_truncated_raw_dir(c),
                          data_dir=os.path.join(c.tmp, "fresh")),
         "could not prepare"),
    Case("client file truncated", lambda c: c.tiny(data_dir=_damaged_client_file(c)),
         "is damaged"),
    Case("a client with no examples", lambda c: c.tiny(num_clients=7000),
         "get no test examples; use fewer clients"),
    Case("unknown partition", lambda c: c.tiny(partition="iid"),
         "--partition=iid: value should be one of", setting="partition"),
    Case("unknown class assignment", lambda c: c.tiny(class_assignment="greedy"),
         "--class_assignment=greedy", setting="class_assignment"),
    Case("dirichlet alpha = 0", lambda c: c.tiny(partition="dirichlet", dirichlet_alpha=0),
         "--dirichlet_alpha must be > 0", setting="dirichlet_alpha"),
    Case("dirichlet on Omniglot", lambda c: c.tiny(dataset="omniglot", num_clients=5,
                                                   partition="dirichlet"),
         "is split one alphabet per client"),
    Case("partition file and an assignment",
         lambda c: c.tiny(partition_file=_manifest(c), class_assignment="independent"),
         "give --partition_file or --partition / --class_assignment, not both"),
    Case("partition file missing", lambda c: c.tiny(partition_file=c.tmp + "/none.json"),
         "No such file or directory"),
    Case("partition file not JSON", lambda c: c.tiny(partition_file=_a_file(c)),
         "is not JSON"),
    Case("partition file of another dataset",
         lambda c: c.tiny(partition_file=_manifest(
             c, lambda m: m.__setitem__("dataset", "mnist"))), "splits mnist, not"),
    Case("partition file edited, fingerprint kept",
         lambda c: c.tiny(partition_file=_manifest(
             c, _clients(lambda cl: cl.pop()), keep_fingerprint=True)),
         "does not match its own partition_fingerprint"),
    Case("partition file with another client count",
         lambda c: c.tiny(partition_file=_manifest(c), num_clients=4),
         "--num_clients=4, but --partition_file"),
    Case("partition file index out of range",
         lambda c: c.tiny(partition_file=_manifest(
             c, _clients(lambda cl: cl[1]["train_indices"].append(60000)))),
         "client 1 of the manifest has train index 60000, outside split 'train'"),
    Case("partition file class not held",
         lambda c: c.tiny(partition_file=_manifest(
             c, _clients(lambda cl: cl[2]["classes"].pop()))), "which it does not hold"),
    Case("partition file empty client",
         lambda c: c.tiny(partition_file=_manifest(
             c, _clients(lambda cl: cl[0].__setitem__("test_indices", [])))),
         "client 0 of the manifest has no test examples"),
    Case("run exists, no resume", lambda c: c.tiny(c.run_dir) + ["--noresume"],
         "already holds a run", protects_run=True),
    Case("checkpoint of other settings", lambda c: c.tiny(c.run_dir, seed=1),
         "seed: checkpoint 0, this run 1)", protects_run=True),
    Case("checkpoint of another model", lambda c: c.tiny(c.run_dir, personalization="none"),
         "personalization: checkpoint 'high', this run 'none'", protects_run=True),
    Case("checkpoint past --rounds", lambda c: c.tiny(c.run_dir, rounds=1),
         "is at round 2, past --rounds=1", protects_run=True),
    Case("corrupted checkpoint",
         lambda c: c.tiny(_corrupt_newest_checkpoint(c)), "cannot be read",
         protects_run=True),
]


@pytest.fixture(scope="module")
def finished_run(prepared, tmp_path_factory) -> str:
  out = str(tmp_path_factory.mktemp("finished") / "run")
  result = subprocess.run(tiny_run(prepared, out) + ["--checkpoint_every=1"], env=ENV,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return out


def _digest(path: str) -> dict[str, str]:
  digests = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        digests[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
  return digests


def test_every_setting_with_allowed_values_has_a_case():
  """A setting given choices or a range later fails here until the table tries it."""
  from tff_pflego import settings
  restricted = {s.name for s in settings.SETTINGS.values()
                if s.choices or s.range_text()}
  assert restricted - {c.setting for c in CASES} == set()
  assert len({c.name for c in CASES}) == len(CASES)


_BINARIES = sorted(n for n in os.listdir(os.path.dirname(TRAIN[1])) if n.endswith(".py"))


@pytest.mark.parametrize("binary,flag", [("train.py", f) for f in (
    "--rounds=-1", "--algorithm=sgd", "--dataset=imagenet", "--head_step=half",
    "--partition=iid")] + [(b, "--no_such_flag=1") for b in _BINARIES])
def test_a_flag_mistake_is_reported_before_tensorflow_loads(binary, flag):
  """A mistyped flag costs a user a fraction of a second, not TensorFlow's start-up."""
  result = run_recording_tensorflow(binary, [flag])
  assert result.stdout.splitlines()[-1:] == ["exit 2 []"], result.stdout + result.stderr
  assert result.stderr.startswith("error: ") and flag.split("=")[0].lstrip("-") in (
      result.stderr), result.stderr


@pytest.mark.parametrize("binary,args,message", [
    ("train.py", ["--eval_clients=1000"], "--eval_clients must be in 1..--num_clients=100"),
    ("train.py", ["--partition_file=/nonexistent/manifest.json"],
     "--partition_file /nonexistent/manifest.json: No such file or directory"),
    ("train.py", ["--workers=localhost"], "not a host:port address"),
    ("train.py", ["--output_dir=/proc/forbidden"], "is not writable"),
    ("train.py", ["--resume", "--overwrite"], "not both"),
    ("export.py", ["--output_dir=/nonexistent", "--export_dir=/nonexistent_export"],
     "--output_dir /nonexistent holds no run"),
    ("reproduce.py", ["--algorithms=pflego,sgd"],
     "cell fashion_mnist/high/sgd/0: --algorithm must be one of"),
    ("reproduce.py", ["--datasets=imagenet"], "--datasets: unknown dataset 'imagenet'"),
    ("reproduce.py", ["--seeds=0,x"], "--seeds: 'x' is not an integer"),
    ("reproduce.py", ["--degrees=extreme"], "--degrees: unknown degree 'extreme'"),
    ("crosscheck_accuracy.py", ["--tff_run=/nonexistent"],
     "--tff_run /nonexistent is not a finished train.py run"),
    ("crosscheck_accuracy.py", ["--partition_seeds=a"],
     "--partition_seeds must be integers >= 0, got 'a'"),
    ("refit_probe.py", ["--run_dir=/nonexistent"],
     "--run_dir /nonexistent holds no run (config.json is missing)"),
    ("compare_runs.py", ["--runs=/nonexistent"], "--runs: /nonexistent holds no run"),
    # The control: input that passes every check without data reaches the data (here
    # missing), and TensorFlow loads before that is found.
    ("train.py", ["--dataset=mnist"], None),
])
def test_input_refused_without_data_is_refused_before_tensorflow_loads(
    binary, args, message, tmp_path):
  """Checks that need no data (ranges across settings, a manifest, a directory) run
  before TensorFlow loads, in a fraction of a second."""
  if message is None:
    args = args + [f"--data_dir={tmp_path}/data", f"--raw_data_dir={tmp_path}/raw",
                   f"--output_dir={tmp_path}/out"]
  result = run_recording_tensorflow(binary, args)
  last = result.stdout.splitlines()[-1:]
  if message is None:
    assert last and last[0].startswith("exit 2 ['tensorflow"), result.stdout + result.stderr
    assert "expected raw file" in result.stderr, result.stderr
    return
  assert last == ["exit 2 []"], result.stdout + result.stderr
  assert result.stderr == f"error: {message}\n" or (
      result.stderr.startswith("error: ") and message in result.stderr
      and result.stderr.count("\n") == 1), result.stderr


def test_the_python_api_checks_the_same_ranges():
  """ExperimentConfig built in Python: the same setting table, the same one line."""
  from tff_pflego.errors import UserError
  from tff_pflego.experiment import ExperimentConfig, resolve
  for setting, bad in (("rounds", 0), ("client_lr", 0.0), ("momentum", 1.0),
                       ("algorithm", "sgd"), ("participation_prob", 1.5)):
    with pytest.raises(UserError, match=f"^--{setting} must be"):
      resolve(ExperimentConfig(**{setting: bad}))


@dataclasses.dataclass
class Outcome:
  returncode: int
  stderr: str
  unchanged: bool  # the finished run it pointed at is byte for byte as before


def _run_case(case: Case, tmp: str, prepared: str, finished_run: str) -> Outcome:
  run_dir = os.path.join(tmp, "run")
  shutil.copytree(finished_run, run_dir)
  ctx = Ctx(tmp, prepared, run_dir)
  args = case.args(ctx)
  before = _digest(run_dir)
  result = subprocess.run(TRAIN + args[len(TRAIN):], env=ENV, capture_output=True,
                          text=True, timeout=300)
  return Outcome(result.returncode, result.stderr, _digest(run_dir) == before)


@pytest.fixture(scope="module")
def outcomes(prepared, finished_run, tmp_path_factory) -> dict[str, Outcome]:
  """Every case's binary run, three at a time (each is mostly interpreter start-up)."""
  from concurrent import futures
  with futures.ThreadPoolExecutor(max_workers=3) as pool:
    jobs = {case.name: pool.submit(_run_case, case, str(tmp_path_factory.mktemp("case")),
                                   prepared, finished_run) for case in CASES}
    return {name: job.result() for name, job in jobs.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_exit_2_and_loses_nothing(case, outcomes):
  result = outcomes[case.name]
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
  assert len(errors) == 1 and case.message in errors[0], result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  if case.protects_run:
    assert result.unchanged
