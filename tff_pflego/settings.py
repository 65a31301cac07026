"""Every setting of a run, defined once: name, type, default, allowed values, help.

`binaries/train.py` defines its flags from this table (`define_flags`: absl
`DEFINE_enum` for choices, `lower_bound`/`upper_bound` for closed ranges, a validator
for open ones, `mark_flags_as_mutual_exclusive` for the exclusive pairs), and
`experiment.ExperimentConfig` takes its fields' defaults from it and checks a
configuration built in Python with `check` (same ranges, same words), so a default or
a range cannot differ between the command line and the Python API.

A default of None means "derived at run time" (mostly: the paper's value for the
dataset, degree and algorithm, `config.paper_defaults`), as each help text says.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional, Sequence

from tff_pflego import config
from tff_pflego.algorithms import options, registry
from tff_pflego.data import partition as partition_lib
from tff_pflego.data import sources
from tff_pflego.errors import UserError


@dataclasses.dataclass(frozen=True)
class Setting:
  name: str
  kind: type  # int, float, str, bool or list (of str)
  default: Any
  help: str
  choices: tuple[str, ...] = ()
  minimum: Optional[float] = None  # value >= minimum
  above: Optional[float] = None  # value > above
  maximum: Optional[float] = None  # value <= maximum
  below: Optional[float] = None  # value < below

  def range_text(self) -> str:
    low = (f">= {self.minimum:g}" if self.minimum is not None
           else f"> {self.above:g}" if self.above is not None else "")
    high = (f"<= {self.maximum:g}" if self.maximum is not None
            else f"< {self.below:g}" if self.below is not None else "")
    if low and high:
      return (f"in {'[' if self.minimum is not None else '('}"
              f"{self.minimum if self.minimum is not None else self.above:g}, "
              f"{self.maximum if self.maximum is not None else self.below:g}"
              f"{']' if self.maximum is not None else ')'}")
    return low or high

  def problem(self, value: Any) -> Optional[str]:
    """Why `value` is not allowed (one line naming the flag), or None."""
    if value is None:
      return None
    if self.choices and value not in self.choices:
      return f"--{self.name} must be one of {', '.join(self.choices)}, got {value!r}"
    out_of_range = (
        (self.minimum is not None and value < self.minimum)
        or (self.above is not None and value <= self.above)
        or (self.maximum is not None and value > self.maximum)
        or (self.below is not None and value >= self.below))
    if out_of_range:
      return f"--{self.name} must be {self.range_text()}, got {value}"
    return None


_PAPER = config.paper_defaults("fashion_mnist", "pflego", "high")  # help examples
_PAPER_BASELINE = config.paper_defaults("fashion_mnist", "fedavg", "high")


def _paper(value) -> str:
  return (" Default: the paper's value for the dataset, degree and algorithm "
          f"(e.g. {value} for PFLEGO on Fashion-MNIST, High).")


def _settings() -> tuple[Setting, ...]:
  return (
      Setting("dataset", str, "fashion_mnist", "Dataset.",
              choices=tuple(sorted(sources.DATASETS))),
      Setting("algorithm", str, "pflego", "Algorithm.", choices=registry.names()),
      Setting("personalization", str, "high",
              "Degree of personalization: high (2 classes per client), medium (half the "
              "classes) or none (all classes); the paper's K.",
              choices=config.PERSONALIZATIONS),
      Setting("partition", str, "classes",
              "How the data is split into clients: classes (the paper's: each client "
              "holds --personalization's number of classes; Omniglot: one alphabet per "
              "client) or dirichlet (each class spread over the clients in "
              "Dirichlet(--dirichlet_alpha) proportions; K_i varies).",
              choices=partition_lib.PARTITIONS),
      Setting("class_assignment", str, "balanced",
              "--partition=classes: balanced (every class held by equally many clients) "
              "or independent (each client draws its classes uniformly without "
              "replacement, independently: the paper's reference code).",
              choices=partition_lib.CLASS_ASSIGNMENTS),
      Setting("dirichlet_alpha", float, 0.5,
              "--partition=dirichlet: concentration alpha (smaller: fewer classes per "
              "client).", above=0),
      Setting("partition_file", str, None,
              "Train on the partition in this manifest (an earlier run's partition.json, "
              "or the same format from another tool) instead of drawing one; "
              "--num_clients defaults to its client count."),
      Setting("num_clients", int, None, "Number of clients (I)."
              + _paper(_PAPER.num_clients) + " Omniglot: 50.", minimum=1),
      Setting("clients_per_round", int, None,
              "Clients sampled per round (r), fixed participation. Default: 20 % of the "
              f"clients (e.g. {_PAPER.clients_per_round}).", minimum=1),
      Setting("participation_prob", float, None,
              "Instead of --clients_per_round: each client takes part with this "
              "probability (pi, Binomial participation).", above=0, maximum=1),
      Setting("rounds", int, None, "Training rounds (T)." + _paper(_PAPER.rounds)
              + " Omniglot: 5000.", minimum=1),
      Setting("local_steps", int, None, "Local steps per client and round (tau)."
              + _paper(_PAPER.local_steps), minimum=1),
      Setting("client_lr", float, None,
              "Client step size (beta): PFLEGO's head-only steps, the baselines' local "
              "steps, ASCD-PFL's head iterations (divided by (1 - p_w) q)."
              f"{_paper(_PAPER.client_lr)} Baselines: mostly "
              f"{_PAPER_BASELINE.client_lr}.", above=0),
      Setting("server_lr", float, None, "Server step size (rho)."
              + _paper(_PAPER.server_lr)
              + f" Baselines: {_PAPER_BASELINE.server_lr} (model averaging). ASCD-PFL: "
              "its body step (SGD, divided by p_w).", above=0),
      Setting("server_optimizer", str, None,
              "Server optimizer. Default: adam for PFLEGO and FedRecon, sgd (model "
              "averaging) for the other baselines; ASCD-PFL has its own (its momentum "
              "coupling) and ignores it.", choices=options.SERVER_OPTIMIZERS),
      Setting("server_lr_schedule", str, "constant",
              "The server rate over the run: constant (the paper's) or cosine "
              "(rho_t = rho (f + (1 - f)(1 + cos(pi (t - 1) / (T - 1))) / 2): rho in "
              "round 1, f rho in round T = --rounds; f = --server_lr_final_fraction).",
              choices=options.SERVER_LR_SCHEDULES),
      Setting("server_lr_final_fraction", float, 0.1,
              "--server_lr_schedule=cosine: the last round's rate as a fraction f of "
              "--server_lr.", above=0, maximum=1),
      Setting("head_step", str, "exact",
              "PFLEGO's final head step: exact (step rho/q * alpha_i, eq. 5) or "
              "paper_code (rho/q, eq. 3 and the reference code).",
              choices=options.HEAD_STEPS),
      Setting("head_optimizer", str, "monotone_gd",
              "PFLEGO's tau-1 head-only steps: monotone_gd (gradient descent whose step "
              "is refused and halved when it would increase the client's loss; equals "
              "plain GD while GD is stable) or gd (the paper's plain GD, which "
              "oscillates at beta=.006 as the features grow).",
              choices=options.HEAD_OPTIMIZERS),
      Setting("seed", int, 0,
              "Seed of the partition, the initialization and the client sampling.",
              minimum=0),
      Setting("eval_every", int, 1,
              "Evaluate the clients every N rounds (and at each of the last 10).",
              minimum=1),
      Setting("eval_clients", int, None,
              "Evaluate a fixed seeded sample of N clients instead of all (large "
              "populations); the summary states the sample mean's standard error. "
              "Default: all clients.", minimum=1),
      Setting("refit_eval", bool, True,
              "Also evaluate every client after it refits its head on the current body "
              "with the head-only steps (tau - 1 steps of rate --client_lr, "
              "--head_optimizer): what a deployed client would see "
              "(test_accuracy_refit_*)."),
      Setting("sampled_eval", bool, True,
              "Also evaluate each round's clients right after their update (the "
              "reference code's protocol: test_accuracy_sampled_pooled)."),
      Setting("output_dir", str, "runs/train", "Where outputs go."),
      Setting("overwrite", bool, False,
              "Replace the run in --output_dir instead of resuming it."),
      Setting("data_dir", str, sources.DEFAULT_DATA_DIR,
              "Prepared TFDS data and client partitions."),
      Setting("raw_data_dir", str, sources.DEFAULT_RAW_DATA_DIR,
              "Raw files of the shared datasets."),
      Setting("progress", bool, True, "Show a progress bar."),
      Setting("dropout_prob", float, 0.0,
              "Each selected client fails to report with this probability (the "
              "estimator divides by q (1 - dropout), so it stays unbiased).",
              minimum=0, below=1),
      Setting("checkpoint_every", int, 10,
              "Checkpoint every N rounds (and after the last; 0: only then). Server "
              "state, every client's personal state, the sampler and the round.",
              minimum=0),
      Setting("resume", bool, None,
              "Continue from the newest checkpoint in --output_dir. Default: yes when "
              "there is one, unless --overwrite."),
      Setting("workers", list, [],
              "host:port of TFF workers (binaries/worker.py) to run the rounds on, "
              "clients spread across them. Default: a private local worker."),
      Setting("export_dir", str, None,
              "At the end, export body, heads and TFF computations here (see "
              "binaries/export.py)."),
      Setting("prox_mu", float, None,
              "Weight of the proximal term (mu/2)||w - w_t||^2: FedProx and Ditto. "
              "Default: 0.25 (FedProx); Ditto 0.25 / 0.5 / 1.0 for high / medium / none.",
              minimum=0),
      Setting("body_steps", int, 5,
              "FedRep: body-only steps after tau - body_steps head-only steps; FedBabu: "
              "body steps per round.", minimum=1),
      Setting("momentum", float, None,
              "Heavy-ball momentum of the local steps (m <- momentum m + grad, restarted "
              "at 0 in every round and phase): FedBabu's body steps (default 0.9) and "
              "FedRep's head and body steps (default 0: plain GD, as the reference "
              "code's default). Other algorithms ignore it.", minimum=0, below=1),
      Setting("cache_head_features", bool, False,
              "Baselines: a head-only phase (FedRecon's reconstruction, FedRep's head "
              "steps) computes the body's features once and steps on them, as PFLEGO "
              "does: the same numbers (the body does not move in the phase), one body "
              "forward pass instead of one per step. Off: the algorithms as published "
              "(their pass counts and timings, Table 3)."),
      Setting("ascd_p_w", float, 0.01,
              "ASCD-PFL: probability of a body iteration; a round is K ~ Geometric(p_w) "
              "- 1 head iterations, then one body iteration (a communication). Default: "
              "tuned on Fashion-MNIST High with the default rates (docs/ascd_pfl).",
              above=0, below=1),
      Setting("ascd_momentum", float, 0.5,
              "ASCD-PFL: c in x = c z + (1 - c) y (0: no momentum, SCD-PFL).",
              minimum=0, below=1),
      Setting("ascd_z_step", float, 2.0,
              "ASCD-PFL: kappa = gamma / eta, z's step relative to y's (1: momentum that "
              "dies out).", above=0),
  )


# Pairs of settings of which at most one may be given.
EXCLUSIVE = (("clients_per_round", "participation_prob"),)

SETTINGS: dict[str, Setting] = {s.name: s for s in _settings()}


def default(name: str) -> Any:
  value = SETTINGS[name].default
  return list(value) if isinstance(value, list) else value


def algorithm_config(**values):
  """An `api.AlgorithmConfig` of `values`, the other fields at their settings' defaults
  (for Python users who build an algorithm without `experiment`)."""
  from tff_pflego.algorithms.api import AlgorithmConfig
  for field in dataclasses.fields(AlgorithmConfig):
    if field.name not in values and field.name in SETTINGS:
      values[field.name] = default(field.name)
  return AlgorithmConfig(**values)


def check(values: dict[str, Any]) -> None:
  """Raises UserError naming the first setting in `values` whose value is not allowed."""
  for name, value in values.items():
    problem = SETTINGS[name].problem(value) if name in SETTINGS else None
    if problem:
      raise UserError(problem)
  for group in EXCLUSIVE:
    given = [name for name in group if values.get(name) is not None]
    if len(given) > 1:
      raise UserError(f"give {' or '.join('--' + n for n in group)}, not both")


def define_flags(module_name: str, flag_values=None,
                 names: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """Defines an absl flag per setting (or per setting in `names`), as flags of
  `module_name` (the binary's `__name__`, so that `--help` lists them); returns
  name -> FlagHolder."""
  from absl import flags
  if module_name == "__main__":  # absl files a script's own flags under its path
    module_name = sys.argv[0]
  flag_values = flag_values or flags.FLAGS
  holders = {}
  for s in (SETTINGS.values() if names is None else [SETTINGS[n] for n in names]):
    kwargs = dict(flag_values=flag_values, module_name=module_name)
    if s.choices:
      holders[s.name] = flags.DEFINE_enum(s.name, s.default, s.choices, s.help, **kwargs)
    elif s.kind in (int, float):
      define = flags.DEFINE_integer if s.kind is int else flags.DEFINE_float
      holders[s.name] = define(s.name, s.default, s.help, lower_bound=s.minimum,
                               upper_bound=s.maximum, **kwargs)
      if s.above is not None or s.below is not None:  # open ends: absl has none
        flags.register_validator(s.name, _open_range_validator(s), flag_values=flag_values)
    elif s.kind is bool:
      holders[s.name] = flags.DEFINE_bool(s.name, s.default, s.help, **kwargs)
    elif s.kind is list:
      holders[s.name] = flags.DEFINE_list(s.name, s.default, s.help, **kwargs)
    else:
      holders[s.name] = flags.DEFINE_string(s.name, s.default, s.help, **kwargs)
  for group in (EXCLUSIVE if names is None else ()):
    flags.mark_flags_as_mutual_exclusive(list(group), flag_values=flag_values)
  return holders


def _open_range_validator(setting: Setting):
  from absl import flags

  def validate(value) -> bool:
    problem = setting.problem(value)
    if problem:
      raise flags.ValidationError(problem)
    return True

  return validate
