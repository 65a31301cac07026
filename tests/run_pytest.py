"""Bazel py_test entry: runs pytest on the test files given as arguments."""

import sys

import pytest

if __name__ == "__main__":
  sys.exit(pytest.main(["-q", "-p", "no:cacheprovider"] + sys.argv[1:]))
