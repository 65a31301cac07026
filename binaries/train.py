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

from tff_pflego import config
from tff_pflego.data import sources

_PAPER = config.paper_defaults("fashion_mnist", "pflego", "high")  # help examples
_PAPER_BASELINE = config.paper_defaults("fashion_mnist", "fedavg", "high")


def _paper(value) -> str:
  return (" Default: the paper's value for the dataset, degree and algorithm "
          f"(e.g. {value} for PFLEGO on Fashion-MNIST, High).")


_DATASET = flags.DEFINE_string(
    "dataset", "fashion_mnist", f"Dataset: {', '.join(sorted(sources.DATASETS))}.")
_ALGORITHM = flags.DEFINE_string(
    "algorithm", "pflego", f"Algorithm: {', '.join(config.ALGORITHMS)}.")
_PERSONALIZATION = flags.DEFINE_string(
    "personalization", "high", "Degree of personalization: high (2 classes per client), "
    "medium (half the classes) or none (all classes); the paper's K.")
_NUM_CLIENTS = flags.DEFINE_integer(
    "num_clients", None, "Number of clients (I)." + _paper(_PAPER.num_clients)
    + " Omniglot: 50.")
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    "clients_per_round", None, "Clients sampled per round (r), fixed participation. "
    f"Default: 20 % of the clients (e.g. {_PAPER.clients_per_round}).")
_PARTICIPATION_PROB = flags.DEFINE_float(
    "participation_prob", None, "Instead of --clients_per_round: each client takes part "
    "with this probability (pi, Binomial participation).")
_ROUNDS = flags.DEFINE_integer(
    "rounds", None, "Training rounds (T)." + _paper(_PAPER.rounds) + " Omniglot: 5000.")
_LOCAL_STEPS = flags.DEFINE_integer(
    "local_steps", None, "Local steps per client and round (tau)."
    + _paper(_PAPER.local_steps))
_CLIENT_LR = flags.DEFINE_float(
    "client_lr", None, "Client step size (beta): PFLEGO's head-only steps, the baselines' "
    f"local steps.{_paper(_PAPER.client_lr)} Baselines: mostly {_PAPER_BASELINE.client_lr}.")
_SERVER_LR = flags.DEFINE_float(
    "server_lr", None, "Server step size (rho)." + _paper(_PAPER.server_lr)
    + f" Baselines: {_PAPER_BASELINE.server_lr} (model averaging).")
_SERVER_OPTIMIZER = flags.DEFINE_string(
    "server_optimizer", None, "Server optimizer: adam or sgd. Default: adam for PFLEGO "
    "and FedRecon, sgd (model averaging) for the other baselines.")
_HEAD_STEP = flags.DEFINE_string(
    "head_step", "exact", "PFLEGO's final head step: exact (step rho/q * alpha_i, eq. 5) "
    "or paper_code (rho/q, eq. 3 and the reference code).")
_HEAD_OPTIMIZER = flags.DEFINE_string(
    "head_optimizer", "monotone_gd", "PFLEGO's tau-1 head-only steps: monotone_gd "
    "(gradient descent whose step is refused and halved when it would increase the "
    "client's loss; equals plain GD while GD is stable) or gd (the paper's plain GD, "
    "which oscillates at beta=.006 as the features grow).")
_SEED = flags.DEFINE_integer(
    "seed", 0, "Seed of the partition, the initialization and the client sampling.")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", 1, "Evaluate the clients every N rounds (and at each of the last 10).")
_EVAL_CLIENTS = flags.DEFINE_integer(
    "eval_clients", None,
    "Evaluate a fixed seeded sample of N clients instead of all (large populations); "
    "the summary states the sample mean's standard error. Default: all clients.")
_SAMPLED_EVAL = flags.DEFINE_bool(
    "sampled_eval", True, "Also evaluate each round's clients right after their update "
    "(the reference code's protocol: test_accuracy_sampled_pooled).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/train", "Where outputs go.")
_OVERWRITE = flags.DEFINE_bool(
    "overwrite", False, "Replace the run in --output_dir instead of resuming it.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", sources.DEFAULT_DATA_DIR, "Prepared TFDS data and client partitions.")
_RAW_DATA_DIR = flags.DEFINE_string(
    "raw_data_dir", sources.DEFAULT_RAW_DATA_DIR, "Raw files of the shared datasets.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar.")
_DROPOUT_PROB = flags.DEFINE_float(
    "dropout_prob", 0.0, "Each selected client fails to report with this probability "
    "(the estimator divides by q (1 - dropout), so it stays unbiased).")
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    "checkpoint_every", 10, "Checkpoint every N rounds (and after the last; 0: only "
    "then). Server state, every client's personal state, the sampler and the round.")
_RESUME = flags.DEFINE_bool(
    "resume", None, "Continue from the newest checkpoint in --output_dir. Default: yes "
    "when there is one, unless --overwrite.")
_WORKERS = flags.DEFINE_list(
    "workers", [], "host:port of TFF workers (binaries/worker.py) to run the rounds on, "
    "clients spread across them. Default: a private local worker.")
_PROX_MU = flags.DEFINE_float(
    "prox_mu", None, "Weight of the proximal term (mu/2)||w - w_t||^2: FedProx and Ditto. "
    "Default: 0.25 (FedProx); Ditto 0.25 / 0.5 / 1.0 for high / medium / none.")
_BODY_STEPS = flags.DEFINE_integer(
    "body_steps", 5, "FedRep: body-only steps after tau - body_steps head-only steps; "
    "FedBabu: body steps per round.")
_MOMENTUM = flags.DEFINE_float("momentum", 0.9, "FedBabu: local heavy-ball momentum.")
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "At the end, export body, heads and TFF computations here "
    "(see binaries/export.py).")


def main(argv: list[str]) -> None:
  from tff_pflego.experiment import ExperimentConfig, run_experiment

  # Every ExperimentConfig field has the flag of the same name.
  values = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(ExperimentConfig)}
  config = ExperimentConfig(**values | dict(workers=tuple(values["workers"])))
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
  cli.run_main(main)
