"""Bazel py_test entry: runs pytest on the test files given as arguments.

The pytest settings are setup.cfg's (a data dependency, so pytest finds it beside the
tests); the tests' tmp_path directories go into the test's own TEST_TMPDIR, which Bazel
cleans, not into /tmp/pytest-of-<user>."""

import os
import sys

import pytest

if __name__ == "__main__":
  basetemp = ([f"--basetemp={os.path.join(os.environ['TEST_TMPDIR'], 'pytest')}"]
              if "TEST_TMPDIR" in os.environ else [])
  sys.exit(pytest.main(["-q"] + basetemp + sys.argv[1:]))
