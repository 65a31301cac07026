"""A new user's first hour: quiet start, set-up that waits for apt, flags checked before
any work, one line for Ctrl-C during start-up, a README that lists the real flags."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ENV, REPO, TRAIN, tiny_run

# TensorFlow's C++ log lines ("2026-11-23 11:24:30.789623: E tensorflow/...") and the
# GPU build's start-up notices.
TF_NOISE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |Unable to register "
                      r"cu|TF-TRT|oneDNN|cuda", re.MULTILINE)
USER_ENV = {k: v for k, v in ENV.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user has
APT_INSTALL = os.path.join(REPO, "tools", "apt_install.sh")


def test_the_cpu_build_of_tensorflow_is_installed_and_not_the_full_one():
  assert importlib.metadata.version("tensorflow-cpu").startswith("2.14.")
  with pytest.raises(importlib.metadata.PackageNotFoundError):
    importlib.metadata.version("tensorflow")


def test_help_prints_only_the_projects_output():
  result = subprocess.run(TRAIN + ["--help"], env=USER_ENV, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stderr == ""
  assert "--num_clients" in result.stdout and "(e.g. 100 for PFLEGO" in result.stdout


def test_a_run_prints_no_tensorflow_log_lines(prepared, tmp_path):
  result = subprocess.run(tiny_run(prepared, tmp_path / "run", rounds=1), env=USER_ENV,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert not TF_NOISE.search(result.stderr + result.stdout), result.stderr[-3000:]


def test_ctrl_c_during_start_up_prints_one_line_and_creates_nothing(tmp_path):
  out = tmp_path / "run"
  proc = subprocess.Popen(tiny_run(tmp_path / "data", out), env=USER_ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(1.0)  # TensorFlow takes several seconds to import
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130, stderr[-3000:]
  assert stderr == "stopped by SIGINT; the outputs written so far are kept\n"
  assert stdout == ""
  assert not out.exists()


@pytest.mark.parametrize("dataset,num_clients,message", [
    ("emnist_letters", 10, "10 clients x 2 classes cannot cover 26 classes; use at "
     "least 13 clients"),
    ("omniglot", 60, "num_clients must be in 1..50, got 60"),
])
def test_partition_mistakes_are_found_before_any_data_is_read(tmp_path, dataset,
                                                              num_clients, message):
  data, out = tmp_path / "data", tmp_path / "run"
  args = tiny_run(data, out) + [f"--dataset={dataset}", f"--num_clients={num_clients}",
                                f"--raw_data_dir={tmp_path / 'no_raw_files'}"]
  result = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.startswith("error: --num_clients=") and message in result.stderr
  assert len(result.stderr.splitlines()) == 1
  assert not data.exists() and not out.exists()  # no data prepared, no directory made


def test_a_run_that_cannot_start_leaves_no_output_directory(prepared, tmp_path):
  out = tmp_path / "run"  # the partition leaves clients without test examples
  result = subprocess.run(tiny_run(prepared, out) + ["--num_clients=7000"], env=ENV,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and "get no test examples" in result.stderr
  assert not out.exists()


def test_readme_lists_exactly_the_flags_of_train_py():
  result = subprocess.run([sys.executable, os.path.join(REPO, "tools", "readme_flags.py"),
                           "--check"], env=ENV, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]


# --- set-up: waiting for another apt/dpkg process ---------------------------------

_STUB_APT = """#!{python}
import fcntl, json, os, sys
with open(os.environ["STUB_LOG"], "a") as log:
  log.write(json.dumps(sys.argv[1:]) + "\\n")
lock = open(os.environ["STUB_LOCK"], "a")
try:  # like apt: a POSIX lock, refused at once when another process holds it
  fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
  print(f"E: Could not get lock {{lock.name}}. It is held by process 4242 (apt-get)",
        file=sys.stderr)
  sys.exit(100)
"""
_HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.lockf(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _apt_stubs(tmp_path):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "apt-get").write_text(_STUB_APT.format(python=sys.executable))
  (bin_dir / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")  # nothing is installed
  for stub in bin_dir.iterdir():
    stub.chmod(0o755)
  return bin_dir


def _hold_lock(path, seconds) -> subprocess.Popen:
  holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(path), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline() == "held\n"
  return holder


def _apt_install(tmp_path, bin_dir, timeout_s):
  env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", APT_SUDO="env",
             APT_LOCK_POLL="0.2", APT_LOCK_TIMEOUT=str(timeout_s),
             STUB_LOG=str(tmp_path / "calls.jsonl"), STUB_LOCK=str(tmp_path / "lock"))
  start = time.monotonic()
  result = subprocess.run(["bash", APT_INSTALL, "some-package"], env=env,
                          capture_output=True, text=True, timeout=120)
  calls = [json.loads(l) for l in (tmp_path / "calls.jsonl").read_text().splitlines()]
  return result, time.monotonic() - start, calls


def test_setup_waits_for_an_apt_lock_held_by_another_process(tmp_path):
  bin_dir = _apt_stubs(tmp_path)
  holder = _hold_lock(tmp_path / "lock", 2.0)
  result, elapsed, calls = _apt_install(tmp_path, bin_dir, timeout_s=60)
  holder.wait(10)
  assert result.returncode == 0, result.stderr
  assert elapsed >= 1.5  # it waited for the holder instead of failing at once
  waiting = [l for l in result.stdout.splitlines() if "waiting for another apt/dpkg" in l]
  assert len(waiting) == 1 and "process 4242 (apt-get)" in waiting[0]
  assert len(calls) >= 3 and all("update" in c for c in calls[:-1])
  assert "install" in calls[-1] and "some-package" in calls[-1]
  assert "DPkg::Lock::Timeout=60" in calls[-1]  # dpkg's own lock: apt waits itself


def test_setup_gives_up_on_a_lock_held_too_long(tmp_path):
  bin_dir = _apt_stubs(tmp_path)
  holder = _hold_lock(tmp_path / "lock", 30.0)
  try:
    result, elapsed, calls = _apt_install(tmp_path, bin_dir, timeout_s=1)
  finally:
    holder.kill()
  assert result.returncode != 0
  assert "lock still held after 1 s; giving up" in result.stderr
  assert not any("install" in c for c in calls)
