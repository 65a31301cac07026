r"""Redraws a run's curves.png from its files (summary.json, metrics.csv, rounds.csv).

  python binaries/plot.py --run_dir=runs/fmnist_high

Useful for a run made by an earlier version, or one copied from another machine.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import os

from absl import flags

from tff_pflego.errors import UserError
from tff_pflego.training import run_files

_RUN_DIR = flags.DEFINE_string("run_dir", None, "The run's --output_dir.", required=True)


def main(argv: list[str]) -> None:
  del argv
  from tff_pflego.training import curves
  summary = os.path.join(_RUN_DIR.value, run_files.SUMMARY_FILE)
  if not os.path.exists(summary):
    raise UserError(f"--run_dir {_RUN_DIR.value} holds no finished run ({summary} is "
                    "missing)")
  print(curves.plot_run(_RUN_DIR.value))


if __name__ == "__main__":
  cli.run_main(main)
