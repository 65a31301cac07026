"""One experiment from a flat configuration: validate, fill the paper's defaults, run.

`binaries/train.py` is a thin absl front end over `run_experiment`; tests and the
benchmarks call it directly.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tff_pflego import config as config_lib
from tff_pflego import runtime
from tff_pflego.algorithms import AlgorithmConfig, build_algorithm
from tff_pflego.algorithms.common import HEAD_OPTIMIZERS
from tff_pflego.algorithms.pflego import HEAD_STEPS
from tff_pflego.data import load_federated_data, sources
from tff_pflego.errors import UserError
from tff_pflego.training import driver
from tff_pflego.training.sampling import ClientSampler

# The paper's Table 1 (Fashion-MNIST), as fractions, drawn on the plots for reference.
PAPER_ACCURACY = {("fashion_mnist", "pflego", "high"): 0.9634,
                  ("fashion_mnist", "pflego", "medium"): 0.8984,
                  ("fashion_mnist", "pflego", "none"): 0.8149}
RUN_FILES = ("metrics.csv", "rounds.csv", "summary.json", "clients.csv", "curves.png")


@dataclasses.dataclass
class ExperimentConfig:
  """Flat settings of one run; None means the paper's value for the dataset/degree."""
  dataset: str = "fashion_mnist"
  algorithm: str = "pflego"
  personalization: str = "high"
  output_dir: str = "runs/default"
  num_clients: Optional[int] = None
  clients_per_round: Optional[int] = None
  participation_prob: Optional[float] = None
  rounds: Optional[int] = None
  local_steps: Optional[int] = None
  client_lr: Optional[float] = None
  server_lr: Optional[float] = None
  server_optimizer: Optional[str] = None
  head_step: str = "exact"
  head_optimizer: str = "monotone_gd"
  seed: int = 0
  eval_every: int = 1
  sampled_eval: bool = True
  data_dir: str = sources.DEFAULT_DATA_DIR
  raw_data_dir: str = sources.DEFAULT_RAW_DATA_DIR
  overwrite: bool = False
  progress: bool = True


def resolve(config: ExperimentConfig) -> ExperimentConfig:
  """Fills unset values with the paper's and checks every value; raises UserError."""
  sources.get_dataset_spec(config.dataset)
  defaults = config_lib.paper_defaults(config.dataset, config.algorithm,
                                       config.personalization)
  c = dataclasses.replace(config)
  for field in ("num_clients", "rounds", "local_steps", "client_lr", "server_lr",
                "server_optimizer"):
    if getattr(c, field) is None:
      setattr(c, field, getattr(defaults, field))
  if c.clients_per_round is None and c.participation_prob is None:
    c.clients_per_round = max(1, round(c.num_clients * defaults.clients_per_round
                                       / defaults.num_clients))
  _check(c.num_clients >= 1, f"--num_clients must be >= 1, got {c.num_clients}")
  _check(c.rounds >= 1, f"--rounds must be >= 1, got {c.rounds}")
  _check(c.local_steps >= 1, f"--local_steps must be >= 1, got {c.local_steps}")
  _check(c.eval_every >= 1, f"--eval_every must be >= 1, got {c.eval_every}")
  _check(c.client_lr > 0, f"--client_lr must be > 0, got {c.client_lr}")
  _check(c.server_lr > 0, f"--server_lr must be > 0, got {c.server_lr}")
  _check(c.head_step in HEAD_STEPS,
         f"--head_step must be one of {', '.join(HEAD_STEPS)}, got {c.head_step!r}")
  _check(c.head_optimizer in HEAD_OPTIMIZERS,
         f"--head_optimizer must be one of {', '.join(HEAD_OPTIMIZERS)}, "
         f"got {c.head_optimizer!r}")
  _check(c.server_optimizer in ("adam", "sgd"),
         f"--server_optimizer must be adam or sgd, got {c.server_optimizer!r}")
  _check(c.clients_per_round is None or c.participation_prob is None,
         "give --clients_per_round or --participation_prob, not both")
  if c.clients_per_round is not None:
    _check(1 <= c.clients_per_round <= c.num_clients,
           f"--clients_per_round must be in 1..--num_clients={c.num_clients}, "
           f"got {c.clients_per_round}")
  else:
    _check(0 < c.participation_prob <= 1,
           f"--participation_prob must be in (0, 1], got {c.participation_prob}")
  _check_output_dir(c.output_dir, c.overwrite)
  return c


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise UserError(message)


def _check_output_dir(path: str, overwrite: bool) -> None:
  existing = [f for f in RUN_FILES if os.path.exists(os.path.join(path, f))]
  if existing and not overwrite:
    raise UserError(f"--output_dir {path} already holds a run ({existing[0]}); "
                    "choose another directory or pass --overwrite")
  try:
    os.makedirs(path, exist_ok=True)
    probe = os.path.join(path, ".write_probe")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise UserError(f"--output_dir {path} is not writable: {e.strerror}") from e


def run_experiment(config: ExperimentConfig) -> dict:
  """Runs one experiment end to end inside a private TFF runtime; returns the summary."""
  c = resolve(config)
  data = load_federated_data(c.dataset, c.personalization, c.num_clients, c.seed,
                             c.data_dir, c.raw_data_dir)
  sampler = ClientSampler(c.num_clients, clients_per_round=c.clients_per_round,
                          participation_prob=c.participation_prob, seed=c.seed)
  algorithm_config = AlgorithmConfig(
      body=data.spec.body, image_shape=data.spec.image_shape,
      max_classes=int(data.num_classes.max()),
      total_examples=int(data.num_train_examples.sum()),
      participation_prob=sampler.participation_prob, local_steps=c.local_steps,
      client_lr=c.client_lr, server_lr=c.server_lr,
      server_optimizer=c.server_optimizer, head_step=c.head_step,
      head_optimizer=c.head_optimizer, seed=c.seed)
  metadata = dict(dataset=c.dataset, algorithm=c.algorithm,
                  personalization=c.personalization,
                  hyperparameters=dataclasses.asdict(algorithm_config) | dict(
                      num_clients=c.num_clients, clients_per_round=c.clients_per_round,
                      participation_prob_flag=c.participation_prob,
                      eval_every=c.eval_every))
  run_config = driver.RunConfig(
      rounds=c.rounds, output_dir=c.output_dir, eval_every=c.eval_every,
      sampled_eval=c.sampled_eval, progress=c.progress, metadata=metadata,
      reference_accuracy=PAPER_ACCURACY.get((c.dataset, c.algorithm, c.personalization)))
  with runtime.local_execution_context(
      log_path=os.path.join(c.output_dir, "tff_worker.log")):
    algorithm = build_algorithm(c.algorithm, algorithm_config)
    return driver.train(algorithm, data, sampler, run_config)


__all__ = ["ExperimentConfig", "resolve", "run_experiment"]
