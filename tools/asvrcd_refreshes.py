"""ASVRCD-PFL's spikes against its reference-point refreshes (README, issue #12).

    .venv/bin/python tools/asvrcd_refreshes.py [--records=docs/unified/runs/synthetic_mx2_sigma0.3]

For every recorded seed of ASVRCD-PFL (`asvrcd_pfl`, `asvrcd_pfl_seed<k>`), recomputes
from the seed the communications at which the run refreshed its reference point v (the
same draws as the run: `sampling.round_schedule` with the run's p_w and rho, read from
its summary) and compares them with the recorded relative suboptimality: evaluations
above --spike after communication --after that follow no refresh within --window
communications, the jump a refresh causes (the largest value within 15 communications
after it over the value before it), how long the run takes to come back, and the final
value of the seeds without a refresh, with an early one, with a late one.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from absl import app, flags  # pylint: disable=g-import-not-at-top

_RECORDS = flags.DEFINE_string(
    "records", os.path.join(REPO, "docs", "unified", "runs", "synthetic_mx2_sigma0.3"),
    "A problem's directory of run records.")
_SPIKE = flags.DEFINE_float("spike", 2e-2, "Relative suboptimality counted as a spike.")
_AFTER = flags.DEFINE_integer("after", 60, "Spikes are counted after this communication.")
_WINDOW = flags.DEFINE_integer("window", 40, "A spike this close after a refresh is its.")
_LATE = flags.DEFINE_integer("late", 900, "A first refresh after this is late.")
KEY = "relative_suboptimality"


def refreshes(seed: int, p_w: float, rho: float, communications: int) -> list[int]:
  """The communications (1..T) at which the run of `seed` refreshed v."""
  import tensorflow as tf
  from tff_pflego.unified import sampling
  return [t for t in range(1, communications + 1) if bool(
      sampling.round_schedule(seed, tf.constant(t), p_w, rho, True)["refresh"])]


def main(argv) -> None:
  del argv
  from tff_pflego import records
  runs = [d for d in glob.glob(os.path.join(_RECORDS.value, "asvrcd_pfl*"))
          if re.fullmatch(r"asvrcd_pfl(_seed\d+)?", os.path.basename(d))]
  if not runs:
    sys.exit(f"error: no asvrcd_pfl records in {_RECORDS.value}")
  unexplained, jumps, returns = 0, [], []
  finals = dict(none=[], early=[], late=[])
  for run in sorted(runs):
    with open(os.path.join(run, "summary.json")) as f:
      summary = json.load(f)
    steps = summary["step_parameters"]
    values = {int(r["round"]): r[KEY] for r in records.read_metrics(run)}
    drawn = refreshes(summary["settings"]["seed"], steps["p_w"], steps["rho"],
                      summary["communications"])
    for t, value in values.items():
      if t > _AFTER.value and value > _SPIKE.value and not any(
          0 <= t - r <= _WINDOW.value for r in drawn):
        unexplained += 1
    for r in drawn:
      before = values[max(t for t in values if t < r)]
      after = [values[t] for t in values if r < t <= r + 15]
      if after:
        jumps.append(max(after) / before)
      back = [t for t in sorted(values) if t > r and values[t] <= max(before, 1e-3)]
      if back:
        returns.append(back[0] - r)
    kind = "none" if not drawn else "early" if drawn[0] < _LATE.value else "late"
    finals[kind].append(values[max(values)])
  print(f"{len(runs)} seeds; evaluations above {_SPIKE.value:g} after communication "
        f"{_AFTER.value} not within {_WINDOW.value} communications after a refresh: "
        f"{unexplained}")
  print(f"a refresh multiplies the relative suboptimality within 15 communications by "
        f"median {np.median(jumps):.0f}x (min {min(jumps):.1f}, max {max(jumps):.0f}; "
        f"{len(jumps)} refreshes); back to its level after median "
        f"{np.median(returns):.0f} communications ({min(returns)}-{max(returns)})")
  for kind, label in (("none", "no refresh"), ("early", f"first refresh < {_LATE.value}"),
                      ("late", f"first refresh >= {_LATE.value}")):
    if finals[kind]:
      print(f"{label}: {len(finals[kind])} seeds, final {min(finals[kind]):.1e}-"
            f"{max(finals[kind]):.1e}")


if __name__ == "__main__":
  app.run(main)
