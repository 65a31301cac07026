"""One experiment's flat configuration and its checks: `ExperimentConfig`, `resolve`.

Free of TensorFlow, so that a binary refuses bad input (a range that depends on
another setting, a partition manifest, an output directory that cannot take the run)
in a fraction of a second; what needs the data (a client left without test examples,
a damaged client file) or a checkpoint is checked by `experiment` once they are read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from typing import Optional

from tff_pflego import config as config_lib
from tff_pflego import settings
from tff_pflego.data import sources
from tff_pflego.data.partition_scheme import (PartitionScheme, check_partition,
                                             read_partition_file)
from tff_pflego.errors import UserError
from tff_pflego.training import run_files
from tff_pflego.worker_address import parse_address

RUN_FILES = (run_files.METRICS_FILE, run_files.ROUNDS_FILE, run_files.SUMMARY_FILE,
             run_files.CLIENTS_FILE, run_files.CURVES_FILE, run_files.PARTITION_FILE)


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
    _, file_partition = read_partition_file(c.partition_file, c.dataset)
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
      parse_address(address)
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
    check_partition(spec, c.personalization, c.num_clients, scheme)
  except UserError as e:
    raise UserError(f"--num_clients={c.num_clients} on {c.dataset}, {c.personalization} "
                    f"personalization: {e}") from None
  checkpointed = has_checkpoint(c.output_dir)
  if c.resume is None:
    c.resume = checkpointed and not c.overwrite
  _check_output_dir(c, checkpointed)
  if c.export_dir is not None:
    check_creatable(c.export_dir, "--export_dir")
  return c


def without_output(c: ExperimentConfig) -> ExperimentConfig:
  """`c` for a setting resolved or prepared outside a run (benchmarks, up-front checks):
  its output directory is one nothing is written to, so `resolve` accepts it."""
  return dataclasses.replace(
      c, overwrite=True, resume=None,
      output_dir=os.path.join(tempfile.gettempdir(), "tff_pflego_not_written"))


# The server rate's schedule, in a run's settings (`schedule_rounds`: the algorithm's).
SCHEDULE_FIELDS = ("server_lr_schedule", "server_lr_final_fraction", "schedule_rounds")


def ignored_in_training(algorithm: str, server_lr_schedule: str) -> set[str]:
  """The settings that change no number `algorithm` computes in training: whether
  the sampled clients are scored and the head-only steps' features cached, the local
  momentum of an algorithm that takes none (`config.LOCAL_MOMENTUM`), and a constant
  server rate's schedule fields."""
  return ({"sampled_eval", "cache_head_features"}
          | (set() if algorithm in config_lib.LOCAL_MOMENTUM else {"momentum"})
          | (set(SCHEDULE_FIELDS) if server_lr_schedule == "constant" else set()))


def partition_scheme(c: ExperimentConfig) -> PartitionScheme:
  """The partition settings of `c` as one `PartitionScheme`."""
  return PartitionScheme(c.partition, c.class_assignment, c.dirichlet_alpha,
                                   c.partition_file)


def has_checkpoint(output_dir: str) -> bool:
  directory = os.path.join(output_dir, run_files.CHECKPOINT_DIR)
  return os.path.isdir(directory) and any(
      name.startswith(run_files.CHECKPOINT_PREFIX) for name in os.listdir(directory))


def _check(condition: bool, message: str) -> None:
  if not condition:
    raise UserError(message)


# Settings that do not change what a run computes: a run stopped before its first
# checkpoint restarts by itself when only these differ.
RUN_INDEPENDENT = ("output_dir", "overwrite", "resume", "progress", "workers",
                   "export_dir", "data_dir", "raw_data_dir", "checkpoint_every")


def existing_run_files(path: str) -> list[str]:
  return [f for f in RUN_FILES + (run_files.CHECKPOINT_DIR,)
          if os.path.exists(os.path.join(path, f))]


def _check_output_dir(c: ExperimentConfig, checkpointed: bool) -> None:
  """The output directory can take this run: new, --overwrite, a checkpoint to resume,
  or the same run stopped before its first checkpoint (it restarts from round 0)."""
  if os.path.exists(c.output_dir) and not os.path.isdir(c.output_dir):
    raise UserError(f"--output_dir {c.output_dir} is a file, not a directory")
  existing = existing_run_files(c.output_dir)
  if existing and not c.overwrite and not (checkpointed and c.resume):
    if checkpointed or not _same_run(c):
      raise UserError(f"--output_dir {c.output_dir} already holds a run ({existing[0]}); "
                      "choose another directory, --resume it, or pass --overwrite")
  check_creatable(c.output_dir, "--output_dir")


def _same_run(c: ExperimentConfig) -> bool:
  """Whether output_dir's config.json is this run's (run-independent settings aside)."""
  try:
    with open(os.path.join(c.output_dir, run_files.CONFIG_FILE)) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return False
  mine = json.loads(json.dumps(dataclasses.asdict(c)))
  return isinstance(saved, dict) and all(
      saved.get(k) == v for k, v in mine.items() if k not in RUN_INDEPENDENT)


def check_creatable(path: str, flag: str) -> None:
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


def make_dir(path: str, flag: str) -> None:
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"{flag} {path} is not writable: {e.strerror}") from e


def load_run_config(output_dir: str, flag: str = "--output_dir") -> ExperimentConfig:
  """The configuration a run in `output_dir` was made with (`flag` names the
  directory in errors)."""
  path = os.path.join(output_dir, run_files.CONFIG_FILE)
  try:
    with open(path) as f:
      saved = json.load(f)
    return ExperimentConfig(**{k: v for k, v in saved.items() if k != "workers"})
  except FileNotFoundError:
    raise UserError(f"{flag} {output_dir} holds no run ({run_files.CONFIG_FILE} is "
                    "missing)") from None
  except (json.JSONDecodeError, TypeError) as e:
    raise UserError(f"{path} is not a run configuration: {e}") from None
