"""Entry points: no TFF worker survives them, and user mistakes exit 2 in one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tff_pflego.errors import UserError
from tff_pflego.experiment import ExperimentConfig, resolve

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [sys.executable, os.path.join(REPO, "binaries", "train.py")]
ENV = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")


def tiny_run(data_dir, output_dir, rounds=2):
  return TRAIN + ["--dataset=fashion_mnist", "--num_clients=5", "--clients_per_round=2",
                  f"--rounds={rounds}", "--local_steps=2", f"--data_dir={data_dir}",
                  f"--output_dir={output_dir}", "--noprogress"]


def workers_of(pid: int) -> list[psutil.Process]:
  try:
    return [c for c in psutil.Process(pid).children(recursive=True)
            if c.name() == "worker_binary"]
  except psutil.NoSuchProcess:
    return []


def wait_for_worker(proc: subprocess.Popen, timeout: float = 120) -> psutil.Process:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, proc.communicate()
    found = workers_of(proc.pid)
    if found:
      return found[0]
    time.sleep(0.2)
  raise AssertionError("the binary never started a TFF worker")


def assert_gone(worker: psutil.Process, timeout: float = 10) -> None:
  try:
    worker.wait(timeout)
  except psutil.NoSuchProcess:
    pass
  assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def prepared(data_dir):
  """Fashion-MNIST partitioned for the tiny runs, before any timing-sensitive test."""
  from tff_pflego.data import load_federated_data
  load_federated_data("fashion_mnist", "high", 5, seed=0, data_dir=data_dir)
  return data_dir


def test_binary_ends_normally_and_leaves_no_worker(prepared, tmp_path):
  before = {p.pid for p in psutil.process_iter() if p.name() == "worker_binary"}
  result = subprocess.run(tiny_run(prepared, tmp_path / "out"), env=ENV,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "test_accuracy_mean" in result.stdout
  after = {p.pid for p in psutil.process_iter()
           if p.name() == "worker_binary" and p.status() != psutil.STATUS_ZOMBIE}
  assert after <= before


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                      (signal.SIGKILL, -9)])
def test_binary_killed_mid_run_leaves_no_worker(prepared, tmp_path, sig, code):
  proc = subprocess.Popen(tiny_run(prepared, tmp_path / "out", rounds=10000), env=ENV,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  worker = wait_for_worker(proc)
  time.sleep(1.0)  # let it get into the rounds
  proc.send_signal(sig)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == code, stderr.decode()[-3000:]
  if sig != signal.SIGKILL:
    assert stderr.decode().strip().endswith(
        f"stopped by {sig.name}; the outputs written so far are kept")
  assert_gone(worker)


def test_exception_inside_the_context_stops_the_worker():
  script = ("from tff_pflego import runtime\n"
            "with runtime.local_execution_context() as w:\n"
            "  print(w.pid, flush=True)\n"
            "  raise RuntimeError('boom')\n")
  result = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True,
                          text=True, timeout=120)
  assert result.returncode == 1 and "boom" in result.stderr
  pid = int(result.stdout.split()[0])
  assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


BAD_CONFIGS = [
    (dict(rounds=-3), "--rounds must be >= 1"),
    (dict(num_clients=10, clients_per_round=11), "--clients_per_round must be in 1..--num_clients=10"),
    (dict(dataset="imagenet"), "unknown dataset 'imagenet'"),
    (dict(personalization="extreme"), "unknown personalization"),
    (dict(algorithm="sgd"), "unknown algorithm"),
    (dict(local_steps=0), "--local_steps must be >= 1"),
    (dict(server_lr=-1.0), "--server_lr must be > 0"),
    (dict(client_lr=0.0), "--client_lr must be > 0"),
    (dict(server_optimizer="rmsprop"), "--server_optimizer must be adam or sgd"),
    (dict(head_step="half"), "--head_step must be one of"),
    (dict(participation_prob=1.5), "--participation_prob must be in"),
    (dict(clients_per_round=3, participation_prob=0.2), "not both"),
    (dict(eval_every=0), "--eval_every must be >= 1"),
    (dict(output_dir="/proc/forbidden"), "is not writable"),
]


@pytest.mark.parametrize("overrides,message", BAD_CONFIGS)
def test_bad_configuration_is_a_user_error(overrides, message, tmp_path):
  config = ExperimentConfig(**{"output_dir": str(tmp_path / "o"), **overrides})
  with pytest.raises(UserError, match=re.escape(message)):
    resolve(config)


def test_existing_run_is_not_overwritten(tmp_path):
  (tmp_path / "summary.json").write_text("{}")
  with pytest.raises(UserError, match="already holds a run"):
    resolve(ExperimentConfig(output_dir=str(tmp_path)))
  assert (tmp_path / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("args,message", [
    (["--rounds=-1"], "--rounds must be >= 1"),
    (["--num_clients=5", "--clients_per_round=9"], "--clients_per_round must be in"),
    (["--dataset=nope"], "unknown dataset"),
    (["--rounds=many"], "error: "),
    (["--output_dir=/proc/forbidden"], "is not writable"),
])
def test_binary_reports_user_mistakes_in_one_line_with_exit_2(args, message):
  result = subprocess.run(TRAIN + args, env=ENV, capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == 2, result.stderr[-2000:]
  lines = [l for l in result.stderr.splitlines() if l.startswith("error: ")]
  assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
  assert "Traceback" not in result.stderr
