"""The repository's shape: every module in a Bazel target, tests that share only helpers."""

from __future__ import annotations

import ast
import glob
import os

from tests.helpers import REPO


def _build_file() -> str:
  with open(os.path.join(REPO, "BUILD")) as f:
    return f.read()


def test_every_library_module_is_in_a_bazel_target():
  build = _build_file()
  for path in glob.glob(os.path.join(REPO, "tff_pflego", "**", "*.py"), recursive=True):
    relative = os.path.relpath(path, REPO)
    package = os.path.dirname(relative)
    globbed = f'glob(["{package}/*.py"])' in build
    assert globbed or f'"{relative}"' in build, f"{relative} is in no BUILD target"


def test_every_binary_is_a_bazel_binary():
  build = _build_file()
  listed = build[build.index('srcs = ["binaries/%s.py" % name]'):]
  for path in glob.glob(os.path.join(REPO, "binaries", "[!_]*.py")):  # Bazel adds __init__
    name = os.path.splitext(os.path.basename(path))[0]
    assert f'"{name}",' in listed, f"binaries/{name}.py is in no BUILD py_binary"


def test_tests_share_code_only_through_helpers_and_conftest():
  for path in glob.glob(os.path.join(REPO, "tests", "test_*.py")):
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
      elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      else:
        continue
      imported_tests = [n for n in names if n.startswith("tests.test_")]
      assert not imported_tests, f"{os.path.basename(path)} imports {imported_tests}"
