r"""Trains a personalized federated algorithm on a real dataset and writes its outputs.

  python binaries/train.py --dataset=fashion_mnist --personalization=high \
      --output_dir=runs/fmnist_high

Unset hyperparameters take the paper's values for the dataset and degree, so the line
above is the paper's Fashion-MNIST High-Pers experiment. Outputs in --output_dir:
metrics.csv, rounds.csv, clients.csv, summary.json, curves.png, tensorboard/,
checkpoints/ and config.json. Run the same line again after a crash or kill to resume.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import dataclasses

from absl import flags

from tff_pflego import settings

# One flag per setting: names, defaults, allowed values and help from tff_pflego.settings.
settings.define_flags(__name__)


def checked_config():
  """The flags as a resolved `ExperimentConfig`: paper defaults filled in, every check
  that needs no data passed (raises UserError). Loads no TensorFlow."""
  from tff_pflego.experiment_config import ExperimentConfig, resolve

  # Every ExperimentConfig field has the flag of the same name.
  values = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(ExperimentConfig)}
  return resolve(ExperimentConfig(**values | dict(workers=tuple(values["workers"]))))


def main(argv: list[str]) -> None:
  from tff_pflego.experiment import run_experiment

  config = checked_config()
  summary = run_experiment(config)
  print_summary(summary, config.output_dir)


def print_summary(summary: dict, output_dir: str) -> None:
  final = summary["final"]
  print(f"\n{summary['algorithm']} on {summary['dataset_display_name']}, "
        f"{summary['personalization']} personalization, {summary['rounds']} rounds, "
        f"{summary['wall_time_s']:.0f} s ({summary['time_per_round_s']:.3f} s/round)")
  print(f"  final ({summary['final_protocols']['window']}):")
  for key in ("test_accuracy_mean", "test_accuracy_pooled", "test_accuracy_worst10",
              "test_accuracy_std", "test_accuracy_sampled_pooled", "train_loss"):
    print(f"    {key:30s} {final[key]:.4f}")
  if "test_accuracy_mean_se" in final:
    print(f"  evaluated a seeded sample of {summary['evaluated_clients']} of "
          f"{summary['num_clients']} clients: test_accuracy_mean is "
          f"{final['test_accuracy_mean']:.4f} +- {final['test_accuracy_mean_se']:.4f} "
          "(standard error)")
  print(f"  outputs: {output_dir}/ (summary.json, metrics.csv, curves.png, ...)")


if __name__ == "__main__":
  cli.run_main(main, check=lambda argv: checked_config())
