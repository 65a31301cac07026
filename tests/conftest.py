"""Shared fixtures: one private TFF runtime for the whole session, small real data."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tff_pflego import runtime  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def tff_context():
  """Every test runs on one private worker, stopped when the session ends."""
  runtime.forbid_implicit_workers()
  with runtime.local_execution_context() as worker:
    yield worker


def pytest_sessionfinish(session, exitstatus):
  """Removes the binaries' temporary directory (tests/helpers.py) with what they left.

  A hook, not a fixture: every process that imported the helpers made the directory,
  including a pytest-xdist worker that ran no test (`-n 2` on one file)."""
  helpers = sys.modules.get("tests.helpers")
  if helpers is not None:
    shutil.rmtree(helpers.CHILDREN_TMPDIR, ignore_errors=True)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> str:
  """A session-wide data dir; FASHION_MNIST prepared once into it by the tests using it.

  TFF_PFLEGO_TEST_DATA_DIR keeps it between sessions, one subdirectory per pytest-xdist
  process (`make test` runs two), so no two processes prepare into one directory."""
  kept = os.environ.get("TFF_PFLEGO_TEST_DATA_DIR")
  if kept:
    return os.path.join(kept, os.environ.get("PYTEST_XDIST_WORKER", "main"))
  return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def prepared(data_dir) -> str:
  """`data_dir` with Fashion-MNIST split into 5 clients, for the binaries' tiny runs."""
  from tff_pflego.data import load_federated_data
  load_federated_data("fashion_mnist", "high", 5, seed=0, data_dir=data_dir)
  return data_dir
