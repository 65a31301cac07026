"""One experiment from a flat configuration: validate, fill the paper's defaults, run.

`binaries/train.py` is a thin absl front end over `run_experiment`; tests and the
benchmarks call it directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Any, Optional

from tff_pflego import config as config_lib
from tff_pflego import export, runtime, settings
from tff_pflego.algorithms.api import AlgorithmConfig
from tff_pflego.algorithms.registry import build_algorithm
from tff_pflego.data import federated, load_federated_data, sources
from tff_pflego.errors import UserError
from tff_pflego.training import checkpoints, driver, evaluation
from tff_pflego.training.sampling import ClientSampler

RUN_FILES = ("metrics.csv", "rounds.csv", "summary.json", "clients.csv", "curves.png",
             driver.PARTITION_FILE)


def _setting(name: str):
  """A field whose default is the setting's (`tff_pflego.settings`)."""
  value = settings.default(name)
  if isinstance(value, list):
    return dataclasses.field(default_factory=lambda: tuple(settings.default(name)))
  return dataclasses.field(default=value)


@dataclasses.dataclass
class ExperimentConfig:
  """Flat settings of one run, one field per setting of `tff_pflego.settings` (same
  name, same default; None means derived at run time, mostly the paper's value)."""
  dataset: str = _setting("dataset")
  algorithm: str = _setting("algorithm")
  personalization: str = _setting("personalization")
  partition: str = _setting("partition")
  class_assignment: str = _setting("class_assignment")
  dirichlet_alpha: float = _setting("dirichlet_alpha")
  partition_file: Optional[str] = _setting("partition_file")
  output_dir: str = _setting("output_dir")
  num_clients: Optional[int] = _setting("num_clients")
  clients_per_round: Optional[int] = _setting("clients_per_round")
  participation_prob: Optional[float] = _setting("participation_prob")
  rounds: Optional[int] = _setting("rounds")
  local_steps: Optional[int] = _setting("local_steps")
  client_lr: Optional[float] = _setting("client_lr")
  server_lr: Optional[float] = _setting("server_lr")
  server_optimizer: Optional[str] = _setting("server_optimizer")
  server_lr_schedule: str = _setting("server_lr_schedule")
  server_lr_final_fraction: float = _setting("server_lr_final_fraction")
  head_step: str = _setting("head_step")
  head_optimizer: str = _setting("head_optimizer")
  seed: int = _setting("seed")
  eval_every: int = _setting("eval_every")
  eval_clients: Optional[int] = _setting("eval_clients")
  sampled_eval: bool = _setting("sampled_eval")
  refit_eval: bool = _setting("refit_eval")
  data_dir: str = _setting("data_dir")
  raw_data_dir: str = _setting("raw_data_dir")
  overwrite: bool = _setting("overwrite")
  progress: bool = _setting("progress")
  dropout_prob: float = _setting("dropout_prob")
  checkpoint_every: int = _setting("checkpoint_every")
  resume: Optional[bool] = _setting("resume")
  workers: tuple[str, ...] = _setting("workers")
  export_dir: Optional[str] = _setting("export_dir")
  prox_mu: Optional[float] = _setting("prox_mu")
  body_steps: int = _setting("body_steps")
  momentum: Optional[float] = _setting("momentum")
  cache_head_features: bool = _setting("cache_head_features")
  ascd_p_w: float = _setting("ascd_p_w")
  ascd_momentum: float = _setting("ascd_momentum")
  ascd_z_step: float = _setting("ascd_z_step")


def resolve(config: ExperimentConfig) -> ExperimentConfig:
  """Fills unset values with the paper's and checks every value; raises UserError."""
  settings.check({f.name: getattr(config, f.name)
                  for f in dataclasses.fields(config)})
  spec = sources.get_dataset_spec(config.dataset)
  defaults = config_lib.paper_defaults(config.dataset, config.algorithm,
                                       config.personalization)
  c = dataclasses.replace(config)
  scheme = partition_scheme(c)
  if c.partition_file is not None:
    _, file_partition = federated.read_partition_file(c.partition_file, c.dataset)
    _check(c.num_clients in (None, file_partition.num_clients),
           f"--num_clients={c.num_clients}, but --partition_file {c.partition_file} has "
           f"{file_partition.num_clients} clients")
    c.num_clients = file_partition.num_clients
  for field in ("num_clients", "rounds", "local_steps", "client_lr", "server_lr",
                "server_optimizer", "prox_mu", "momentum"):
    if getattr(c, field) is None:
      setattr(c, field, getattr(defaults, field))
  if c.clients_per_round is None and c.participation_prob is None:
    c.clients_per_round = max(1, round(c.num_clients * defaults.clients_per_round
                                       / defaults.num_clients))
  # The ranges that depend on another setting.
  _check(c.eval_clients is None or c.eval_clients <= c.num_clients,
         f"--eval_clients must be in 1..--num_clients={c.num_clients}, "
         f"got {c.eval_clients}")
  _check(c.clients_per_round is None or c.clients_per_round <= c.num_clients,
         f"--clients_per_round must be in 1..--num_clients={c.num_clients}, "
         f"got {c.clients_per_round}")
  for address in c.workers:
    try:
      runtime.parse_address(address)
    except ValueError as e:
      raise UserError(f"--workers: {e}") from None
  _check(len(set(c.workers)) == len(c.workers), "--workers lists a worker twice")
  _check(not (c.resume and c.overwrite), "give --resume or --overwrite, not both")
  _check(c.server_lr_schedule == "constant" or c.algorithm != "ascd_pfl",
         "--server_lr_schedule: ascd_pfl steps its body with its own coupled SGD; "
         "only constant applies")
  try:
    scheme.check(spec)
  except UserError as e:
    raise UserError(f"{c.dataset}: {e}") from None
  try:
    federated.check_partition(spec, c.personalization, c.num_clients, scheme)
  except UserError as e:
    raise UserError(f"--num_clients={c.num_clients} on {c.dataset}, {c.personalization} "
                    f"personalization: {e}") from None
  checkpointed = has_checkpoint(c.output_dir)
  if c.resume is None:
    c.resume = checkpointed and not c.overwrite
  _check_output_dir(c, checkpointed)
  if c.export_dir is not None:
    _check_creatable(c.export_dir, "--export_dir")
  return c


def partition_scheme(c: ExperimentConfig) -> federated.PartitionScheme:
  """The partition settings of `c` as one `federated.PartitionScheme`."""
  return federated.PartitionScheme(c.partition, c.class_assignment, c.dirichlet_alpha,
                                   c.partition_file)


def has_checkpoint(output_dir: str) -> bool:
  directory = os.path.join(output_dir, driver.CHECKPOINT_DIR)
  return os.path.isdir(directory) and any(
      name.startswith(checkpoints.PREFIX) for name in os.listdir(directory))


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise UserError(message)


# Settings that do not change what a run computes: a run stopped before its first
# checkpoint restarts by itself when only these differ.
_RUN_INDEPENDENT = ("output_dir", "overwrite", "resume", "progress", "workers",
                    "export_dir", "data_dir", "raw_data_dir", "checkpoint_every")


def _existing_run_files(path: str) -> list[str]:
  return [f for f in RUN_FILES + (driver.CHECKPOINT_DIR,)
          if os.path.exists(os.path.join(path, f))]


def _check_output_dir(c: ExperimentConfig, checkpointed: bool) -> None:
  """The output directory can take this run: new, --overwrite, a checkpoint to resume,
  or the same run stopped before its first checkpoint (it restarts from round 0)."""
  if os.path.exists(c.output_dir) and not os.path.isdir(c.output_dir):
    raise UserError(f"--output_dir {c.output_dir} is a file, not a directory")
  existing = _existing_run_files(c.output_dir)
  if existing and not c.overwrite and not (checkpointed and c.resume):
    if checkpointed or not _same_run(c):
      raise UserError(f"--output_dir {c.output_dir} already holds a run ({existing[0]}); "
                      "choose another directory, --resume it, or pass --overwrite")
  _check_creatable(c.output_dir, "--output_dir")


def _same_run(c: ExperimentConfig) -> bool:
  """Whether output_dir's config.json is this run's (run-independent settings aside)."""
  try:
    with open(os.path.join(c.output_dir, driver.CONFIG_FILE)) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return False
  mine = json.loads(json.dumps(dataclasses.asdict(c)))
  return isinstance(saved, dict) and all(
      saved.get(k) == v for k, v in mine.items() if k not in _RUN_INDEPENDENT)


def _check_creatable(path: str, flag: str) -> None:
  """`path` is a writable directory or can be made one; tried, then undone."""
  path = os.path.abspath(path)
  missing = []  # the directories to create, deepest first
  existing = path
  while not os.path.exists(existing):
    missing.append(existing)
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserError(f"{flag} {path}: {existing} is a file, not a directory")
  try:
    for directory in reversed(missing):
      os.mkdir(directory)
    probe = os.path.join(path, ".write_probe")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise UserError(f"{flag} {path} is not writable: {e.strerror}") from e
  finally:
    for directory in missing:
      if os.path.isdir(directory):
        os.rmdir(directory)


def _make_dir(path: str, flag: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"{flag} {path} is not writable: {e.strerror}") from e


@dataclasses.dataclass
class Prepared:
  data: Any
  sampler: ClientSampler
  algorithm_config: AlgorithmConfig
  fingerprint: dict


_SCHEDULE_FIELDS = ("server_lr_schedule", "server_lr_final_fraction", "schedule_rounds")


def training_settings(config: AlgorithmConfig, algorithm: str) -> dict:
  """The settings `algorithm` depends on in training (local evaluation only adds
  metrics). A constant server rate leaves the schedule's fields out, so that
  checkpoints written before the schedule existed keep their fingerprint and resume;
  so does the local momentum of an algorithm that ignores it (written as 0.9 before
  FedRep took it). Caching the head-only steps' features changes no number: a run
  resumes with or without it."""
  ignored = {"sampled_eval", "cache_head_features"} | (
      set() if algorithm in config_lib.LOCAL_MOMENTUM else {"momentum"})
  settings = {k: v for k, v in dataclasses.asdict(config).items() if k not in ignored}
  if config.server_lr_schedule == "constant":
    settings = {k: v for k, v in settings.items() if k not in _SCHEDULE_FIELDS}
  return settings


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
  config = ExperimentConfig(
      dataset=dataset, algorithm=algorithm, overwrite=True,
      output_dir=os.path.join(tempfile.gettempdir(), "tff_pflego_not_written"), **settings)
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
  _make_dir(c.output_dir, "--output_dir")  # only now: the run can start
  if not c.resume:  # a fresh run replaces the old one's checkpoints (--overwrite)
    if not c.overwrite and _existing_run_files(c.output_dir):
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


def load_run_config(output_dir: str, flag: str = "--output_dir") -> ExperimentConfig:
  """The configuration a run in `output_dir` was made with (`flag` names the
  directory in errors)."""
  path = os.path.join(output_dir, driver.CONFIG_FILE)
  try:
    with open(path) as f:
      saved = json.load(f)
    return ExperimentConfig(**{k: v for k, v in saved.items() if k != "workers"})
  except FileNotFoundError:
    raise UserError(f"{flag} {output_dir} holds no run ({driver.CONFIG_FILE} is "
                    "missing)") from None
  except (json.JSONDecodeError, TypeError) as e:
    raise UserError(f"{path} is not a run configuration: {e}") from None


def export_experiment(output_dir: str, export_dir: str) -> dict[str, str]:
  """Exports the newest checkpoint of the run in `output_dir` (see `export.py`)."""
  c = load_run_config(output_dir)
  _check_creatable(export_dir, "--export_dir")
  p = prepare(c)
  _make_dir(export_dir, "--export_dir")
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
