#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are not installed yet.
# Another apt/dpkg process holding a lock is waited for (up to $APT_LOCK_TIMEOUT s,
# default 900) instead of failing: `apt-get update` retries while the package lists are
# locked (apt's DPkg::Lock::Timeout does not cover that lock), `apt-get install` waits
# through DPkg::Lock::Timeout.
set -euo pipefail

timeout_s=${APT_LOCK_TIMEOUT:-900}
poll_s=${APT_LOCK_POLL:-5}
apt_get=${APT_GET:-apt-get}

missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=${APT_SUDO:-}  # how to run apt-get as root; default: directly as root, else sudo
if [ -z "$SUDO" ] && [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

# Runs apt-get "$@"; while it fails on a lock held by another process, waits and retries.
apt_waiting_for_locks() {
  local start=$SECONDS said="" out status
  while true; do
    status=0
    out=$($SUDO env DEBIAN_FRONTEND=noninteractive "$apt_get" \
        -o DPkg::Lock::Timeout="$timeout_s" "$@" 2>&1) || status=$?
    if [ $status -eq 0 ] || ! grep -q "Could not get lock" <<<"$out"; then
      [ $status -ne 0 ] && printf '%s\n' "$out" >&2
      return $status
    fi
    if [ $((SECONDS - start)) -ge "$timeout_s" ]; then
      printf '%s\n' "$out" >&2
      echo "setup: apt/dpkg lock still held after ${timeout_s} s; giving up" >&2
      return $status
    fi
    if [ -z "$said" ]; then
      holder=$(grep -o "held by process [0-9]* ([^)]*)" <<<"$out" | head -1 || true)
      echo "setup: waiting for another apt/dpkg process to finish (lock ${holder:-held})"
      said=1
    fi
    sleep "$poll_s"
  done
}

echo "setup: installing Debian packages: ${missing[*]}"
apt_waiting_for_locks update -q
apt_waiting_for_locks install -y -q "${missing[@]}"
