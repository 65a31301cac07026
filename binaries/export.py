r"""Exports a trained (or checkpointed) run for TF systems without this package.

  python binaries/export.py --output_dir=runs/fashion_mnist_high --export_dir=export/

Writes, from the run's newest checkpoint: the body (SavedModel and Keras), every
client's head (heads.npz + heads.json), a SavedModel serving body + a client's head,
and the TFF initialize/next computations serialized (see tff_pflego/export.py).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

from absl import flags


_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "The run to export.")
_EXPORT_DIR = flags.DEFINE_string("export_dir", None, "Where the artifacts go.")
flags.mark_flags_as_required(["output_dir", "export_dir"])


def main(argv: list[str]) -> None:
  from tff_pflego.experiment import export_experiment
  paths = export_experiment(_OUTPUT_DIR.value, _EXPORT_DIR.value)
  for name, path in paths.items():
    print(f"{name:26s} {path}")


def check(argv: list[str]) -> None:
  """Before TensorFlow loads: a run to export, and an export directory that can be made."""
  from tff_pflego.experiment_config import check_creatable, load_run_config
  load_run_config(_OUTPUT_DIR.value)
  check_creatable(_EXPORT_DIR.value, "--export_dir")


if __name__ == "__main__":
  cli.run_main(main, check=check)
