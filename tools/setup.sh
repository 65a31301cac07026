#!/usr/bin/env bash
# Idempotent set-up of tff-pflego: Debian packages, then a virtual environment at .venv/
# with the pinned Python packages. A second run only checks stamps and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(dataset-fashion-mnist bazel-bootstrap bazel-rules-java)
TFF_VERSION=0.87.0

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

root=$(pwd)
cat > .bazelrc.user <<BAZELRC
common --override_repository=rules_java=/usr/share/bazel/rules/java
common --override_repository=rules_cc=$root/tools/bazel/rules_cc
common --override_repository=remote_coverage_tools=$root/tools/bazel/remote_coverage_tools
build --python_path=$root/.venv/bin/python
BAZELRC

PY=${PYTHON:-python3}
stamp_hash=$(cat requirements.lock setup.cfg | sha256sum | cut -c1-16)
stamp=.venv/.installed-$stamp_hash
if [ -f "$stamp" ]; then
  exit 0
fi
echo "setup: creating .venv and installing pinned packages"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade "pip<25" wheel "setuptools<70"
.venv/bin/pip install -q --no-deps "tensorflow-federated==$TFF_VERSION"
.venv/bin/pip install -q -r requirements.lock
.venv/bin/pip install -q --no-deps --no-build-isolation -e .
rm -f .venv/.installed-*
touch "$stamp"
echo "setup: done"
