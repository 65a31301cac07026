"""One experiment from a flat configuration: validate, fill the paper's defaults, run.

`binaries/train.py` is a thin absl front end over `run_experiment`; tests and the
benchmarks call it directly.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from typing import Any, Optional

from tff_pflego import config as config_lib
from tff_pflego import export, runtime
from tff_pflego.algorithms.api import AlgorithmConfig
from tff_pflego.algorithms.registry import build_algorithm
from tff_pflego.data import load_federated_data
from tff_pflego.experiment_config import (ExperimentConfig, check_creatable,
                                         existing_run_files, has_checkpoint,
                                         ignored_in_training, load_run_config, make_dir, partition_scheme,
                                         resolve, without_output)
from tff_pflego.training import driver, evaluation
from tff_pflego.training.sampling import ClientSampler


@dataclasses.dataclass
class Prepared:
  data: Any
  sampler: ClientSampler
  algorithm_config: AlgorithmConfig
  fingerprint: dict


def training_settings(config: AlgorithmConfig, algorithm: str) -> dict:
  """The settings `algorithm` depends on in training (local evaluation only adds
  metrics): every field but `ignored_in_training`'s, so that checkpoints written before
  the server rate's schedule existed, or before FedRep took the local momentum (written
  as 0.9 before), keep their fingerprint and resume; a run resumes with or without
  cached head features (the same numbers)."""
  ignored = ignored_in_training(algorithm, config.server_lr_schedule)
  return {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored}


def training_algorithm(name: str, config: AlgorithmConfig, client_data=None):
  """The algorithm without in-round evaluation: what benchmarks time and exports hold.

  With `client_data` (`FederatedData.client_data_computations`), `next` takes ids.
  """
  return build_algorithm(name, dataclasses.replace(config, sampled_eval=False),
                         client_data)


def prepare_training(dataset: str, algorithm: str, data_dir: Optional[str] = None,
                     **settings) -> tuple[Prepared, Any]:
  """The prepared data and sampler of a setting (the paper's where `settings` says
  nothing) and its `training_algorithm`, `next` on client ids: for benchmarks and
  tools that time rounds outside a run (nothing is written to an output directory)."""
  config = without_output(ExperimentConfig(dataset=dataset, algorithm=algorithm, **settings))
  if data_dir:
    config.data_dir = data_dir
  prepared = prepare(resolve(config))
  return prepared, training_algorithm(algorithm, prepared.algorithm_config,
                                      prepared.data.client_data_computations)


def prepare(c: ExperimentConfig) -> Prepared:
  """Data, sampler and algorithm settings of a resolved configuration."""
  data = load_federated_data(c.dataset, c.personalization, c.num_clients, c.seed,
                             c.data_dir, c.raw_data_dir, partition_scheme(c))
  sampler = ClientSampler(c.num_clients, clients_per_round=c.clients_per_round,
                          participation_prob=c.participation_prob,
                          dropout_prob=c.dropout_prob, seed=c.seed)
  algorithm_config = AlgorithmConfig(
      body=data.spec.body, image_shape=data.spec.image_shape,
      max_classes=int(data.num_classes.max()),
      total_examples=int(data.num_train_examples.sum()),
      participation_prob=sampler.participation_prob, local_steps=c.local_steps,
      client_lr=c.client_lr, server_lr=c.server_lr,
      server_optimizer=c.server_optimizer, head_step=c.head_step,
      head_optimizer=c.head_optimizer, seed=c.seed, prox_mu=c.prox_mu,
      body_steps=c.body_steps, momentum=c.momentum, ascd_p_w=c.ascd_p_w,
      ascd_momentum=c.ascd_momentum, ascd_z_step=c.ascd_z_step,
      sampled_eval=c.sampled_eval, server_lr_schedule=c.server_lr_schedule,
      server_lr_final_fraction=c.server_lr_final_fraction,
      schedule_rounds=c.rounds if c.server_lr_schedule != "constant" else 0,
      cache_head_features=c.cache_head_features)
  fingerprint = dict(dataset=c.dataset, algorithm=c.algorithm,
                     personalization=c.personalization, num_clients=c.num_clients,
                     clients_per_round=c.clients_per_round,
                     participation_prob_flag=c.participation_prob,
                     dropout_prob=c.dropout_prob,
                     data_fingerprint=data.provenance["partition_fingerprint"],
                     ) | training_settings(algorithm_config, c.algorithm)
  return Prepared(data, sampler, algorithm_config, fingerprint)


def run_experiment(config: ExperimentConfig) -> dict:
  """Runs (or resumes) one experiment end to end; returns the summary.

  Computations run on a private local TFF worker, or on `config.workers`.
  """
  c = resolve(config)
  p = prepare(c)
  scheme = p.data.provenance["partition_scheme"]
  metadata = dict(dataset=c.dataset, algorithm=c.algorithm,
                  personalization=c.personalization, partition=scheme,
                  hyperparameters=dataclasses.asdict(p.algorithm_config) | dict(
                      num_clients=c.num_clients, clients_per_round=c.clients_per_round,
                      participation_prob_flag=c.participation_prob,
                      dropout_prob=c.dropout_prob, eval_every=c.eval_every,
                      workers=list(c.workers)))
  run_config = driver.RunConfig(
      rounds=c.rounds, output_dir=c.output_dir, eval_every=c.eval_every,
      sampled_eval=c.sampled_eval, eval_clients=c.eval_clients, seed=c.seed,
      progress=c.progress, metadata=metadata,
      reference_accuracy=(  # the paper's figures are of its class partition
          config_lib.PAPER_ACCURACY.get((c.dataset, c.algorithm, c.personalization))
          if scheme["partition"] in ("classes", "alphabets") else None),
      checkpoint_every=c.checkpoint_every, resume=c.resume, fingerprint=p.fingerprint,
      settings=dataclasses.asdict(c) | dict(workers=list(c.workers)),
      head_refit=evaluation.HeadRefit(c.local_steps - 1, c.client_lr, c.head_optimizer)
      if c.refit_eval else None)
  make_dir(c.output_dir, "--output_dir")  # only now: the run can start
  if not c.resume:  # a fresh run replaces the old one's checkpoints (--overwrite)
    if not c.overwrite and existing_run_files(c.output_dir):
      print(f"{c.output_dir} holds this run, stopped before its first checkpoint: "
            "starting it again from round 0", flush=True)
    shutil.rmtree(os.path.join(c.output_dir, driver.CHECKPOINT_DIR), ignore_errors=True)
  with runtime.execution_context(
      c.workers, log_path=os.path.join(c.output_dir, "tff_worker.log")):
    algorithm = build_algorithm(c.algorithm, p.algorithm_config,
                                p.data.client_data_computations)
    summary = driver.train(algorithm, p.data, p.sampler, run_config)
    if c.export_dir is not None:
      _export(c, p)
  return summary


def export_experiment(output_dir: str, export_dir: str) -> dict[str, str]:
  """Exports the newest checkpoint of the run in `output_dir` (see `export.py`)."""
  c = load_run_config(output_dir)
  check_creatable(export_dir, "--export_dir")
  p = prepare(c)
  make_dir(export_dir, "--export_dir")
  with runtime.local_execution_context(
      log_path=os.path.join(export_dir, "tff_worker.log")):
    return _export(c, p, export_dir=export_dir)


def _export(c: ExperimentConfig, p: Prepared,
            export_dir: Optional[str] = None) -> dict[str, str]:
  algorithm = training_algorithm(c.algorithm, p.algorithm_config)
  manager = driver.checkpoint_manager(algorithm, p.data, c.output_dir, p.fingerprint)
  run = manager.load_latest()
  return export.export_run(export_dir or c.export_dir, algorithm, run, p.data,
                           source=dict(output_dir=os.path.abspath(c.output_dir),
                                       dataset=c.dataset, algorithm=c.algorithm,
                                       personalization=c.personalization, seed=c.seed))


__all__ = ["ExperimentConfig", "resolve", "run_experiment", "export_experiment"]
