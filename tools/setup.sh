#!/usr/bin/env bash
# Idempotent set-up of tff-pflego: Debian packages, then a virtual environment at .venv/
# with the pinned Python packages. A second run only checks stamps and takes seconds.
#   tools/setup.sh           what `make run` / `make test` need
#   tools/setup.sh --bazel   also Bazel (`make bazel-build`, `make bazel-test`, CI)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(dataset-fashion-mnist)
BAZEL_APT_PACKAGES=(bazel-bootstrap bazel-rules-java)
TFF_VERSION=0.87.0
PIP_QUIET=(-q --no-warn-conflicts)

packages=("${APT_PACKAGES[@]}")
if [ "${1:-}" = "--bazel" ]; then
  packages+=("${BAZEL_APT_PACKAGES[@]}")
  root=$(pwd)
  cat > .bazelrc.user <<BAZELRC
common --override_repository=rules_java=/usr/share/bazel/rules/java
common --override_repository=rules_cc=$root/tools/bazel/rules_cc
common --override_repository=remote_coverage_tools=$root/tools/bazel/remote_coverage_tools
build --python_path=$root/.venv/bin/python
test --test_env=TFF_PFLEGO_RAW_DATA=$(dirname "$root")/shared/datasets
BAZELRC
elif [ $# -gt 0 ]; then
  echo "usage: tools/setup.sh [--bazel]" >&2
  exit 2
fi
bash tools/apt_install.sh "${packages[@]}"

PY=${PYTHON:-python3}
stamp_hash=$(cat requirements.lock setup.cfg tools/setup.sh | sha256sum | cut -c1-16)
stamp=.venv/.installed-$stamp_hash
if [ -f "$stamp" ]; then
  exit 0
fi
echo "setup: creating .venv and installing pinned packages"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install "${PIP_QUIET[@]}" --upgrade "pip<25" wheel "setuptools>=64,<70"
# requirements.lock is the complete pinned set, so nothing is resolved: --no-deps keeps
# packages that name `tensorflow` as a requirement (tensorflow-privacy, TFF) from pulling
# the full GPU build next to tensorflow-cpu. TFF 0.87 pins jaxlib==0.4.14, which the
# registry does not serve; the lock's jaxlib 0.4.13 works (the whole suite runs on it).
.venv/bin/pip install "${PIP_QUIET[@]}" --no-deps -r requirements.lock \
    "tensorflow-federated==$TFF_VERSION"
.venv/bin/pip install "${PIP_QUIET[@]}" --no-deps --no-build-isolation --use-pep517 -e .
if .venv/bin/pip show -q tensorflow 2>/dev/null; then
  echo "setup: removing the full tensorflow build (tensorflow-cpu provides the module)"
  .venv/bin/pip uninstall -q -y tensorflow
  .venv/bin/pip install "${PIP_QUIET[@]}" --no-deps --force-reinstall \
      "$(grep '^tensorflow-cpu==' requirements.lock)"
fi
echo "setup: jaxlib 0.4.13 instead of TFF's pin 0.4.14 (not in the registry; tested)"
rm -f .venv/.installed-*
touch "$stamp"
echo "setup: done"
