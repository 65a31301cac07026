r"""The paper's ablations: one or two settings varied, everything else the paper's.

  python binaries/ablate.py --study=participation  # CIFAR-10 High: r, PFLEGO/FedAvg/FedPer
  python binaries/ablate.py --study=rates          # Omniglot: PFLEGO's beta x rho
  python binaries/ablate.py --study=tau            # Omniglot: tau x participants per
                                                   # round, PFLEGO and FedRecon
  python binaries/ablate.py --study=server_rate    # CIFAR-10 High: PFLEGO's server rate,
                                                   # constant or cosine (issue #14 §0)
  python binaries/ablate.py --study=fedrep_local   # Fashion-MNIST None: FedRep's local
                                                   # momentum x body steps

A study names the paper's dataset, degree, algorithms and values (`STUDIES`);
`--dataset`, `--degree`, `--algorithms` and `--vary` replace them, e.g. where the
paper's dataset does not fit on the machine (`--dataset=mnist`: say so where the figure
is shown). `--vary=name=v1,v2,...` (at most twice) names a setting of train.py and its
values (numbers, or a choice such as --server_lr_schedule's constant / cosine); every
other setting is the paper's for the dataset, degree and algorithm, and `--rounds`
below the paper's T marks every cell "shortened". Every cell is checked before the
first one runs, so a bad value costs no compute. `--cache_head_features` (train.py's)
computes the body's features once per head-only phase: the same numbers, faster
FedRecon / FedRep cells (the tau study's FedRecon on Omniglot).

`--against=<run>[,<run>...]` puts finished runs from outside the study (a grid cell's
record, e.g. docs/runs/cifar10/none/pflego/seed0) into its tables and figure, each at
the varied values its own config.json holds (the grid's constant-rate cell beside a
study of the cosine rate): every other setting its figures depend on must be the
study's, and its partition that of the study's cells of its seed (else exit 2, before
any cell runs); a run standing where a cell of the study does is refused. Its row is
kept with the study's (marked `outside_study`): tables mark its entries †, the figure
draws its point hollow.

`--tables_only` runs nothing: the study's table, figure and results.csv are written
again from its finished cells (their runs, else their records; a row names the record
when there is one) and the rows kept before.

Each cell is a train.py run (the same `run_experiment`, resumable; a finished cell is
skipped) in <output_dir>/<study>/<dataset>_<degree>[_T<rounds>]/<algorithm>/
<name>=<value>[,<name>=<value>]/seed<k>/. Several invocations over one --output_dir
share a study: a cell claimed by one is skipped by the others. The study's directory
gets, after every cell:
  results.csv  one row per finished cell: its varied values and its figures
               (`cells.run_figures`: the last 10 evaluations of each protocol); kept
               across invocations that vary the same settings, so a second run with
               other values or algorithms adds to the same tables
  results.md   per protocol (all clients; sampled clients right after their update; all
               clients after a head refit), a table: one row per algorithm (and value
               of the second setting), one column per value of the first; mean ± std
               over the last 10 evaluations, or over the seeds (sample std, n=) when
               several ran; then L(psi) at T with the stored heads, its largest rise
               above its best so far, and L(psi) at T after a head refit
  ablation.png each protocol's accuracy and L(psi) at the end, against the first
               setting: one line per algorithm, or with two settings, a column of
               panels per algorithm and one line per value of the second
`--docs_dir` copies the three there, after every cell, as
ablation_<study>_<dataset>_<degree>[_T<rounds>].md / .png / .csv, and keeps every
finished cell's record under <docs_dir>/ablations/<study>/... (`tff_pflego/records.py`),
so a fresh clone tabulates the study without its runs; a cell stopped before its end
(Ctrl-C, SIGTERM, an error) is parked in its record and the same command continues it
there, as `reproduce.py` does (`cells.run_or_continue`). A --docs_dir table with no
.csv of its rows beside it (written before rows were kept) would be replaced by this
invocation's rows alone, so the study stops first (exit 2);
`--recover_rows_from=<that table>` reads its cells (2 decimals, one seed each) into the
.csv, where the later cells join them.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import dataclasses
import itertools
import json
import os
import re
import shutil
from typing import Optional

from absl import flags
import numpy as np

from tff_pflego import records
from tff_pflego import settings
from tff_pflego.config import PAPER_ACCURACY, PERSONALIZATIONS
from tff_pflego.errors import UserError
from tff_pflego.experiment_config import (RUN_INDEPENDENT, ignored_in_training,
                                         load_run_config, resolve, without_output)
from tff_pflego.training import cells
from tff_pflego.training import grid
from tff_pflego.training import run_files


@dataclasses.dataclass(frozen=True)
class Study:
  """Where the paper ran an ablation and what it varied."""
  dataset: str
  degree: str
  algorithms: tuple[str, ...]
  vary: tuple[tuple[str, tuple[float, ...]], ...]  # (setting, values), at most two
  title: str


STUDIES = {
    "participation": Study(
        "cifar10", "high", ("pflego", "fedavg", "fedper"),
        (("clients_per_round", (5, 10, 20, 50, 100)),),
        "participation rate r = clients_per_round / I"),
    "rates": Study(
        "omniglot", "high", ("pflego",),
        (("client_lr", (0.03, 0.1341, 0.5)), ("server_lr", (0.001, 0.003, 0.01))),
        "PFLEGO's rates: client beta and server rho"),
    "tau": Study(
        "omniglot", "high", ("pflego", "fedrecon"),
        (("local_steps", (5, 10, 25, 50)), ("clients_per_round", (4, 16, 28))),
        "inner steps tau, at several numbers of participants per round"),
    # Not in the paper: issue #14 §0, where L(psi) rises on CIFAR-10 at the paper's rates.
    "server_rate": Study(
        "cifar10", "high", ("pflego",),
        (("server_lr_schedule", ("constant", "cosine")), ("server_lr", (0.001, 0.0003))),
        "PFLEGO's server rate over the run (stale heads, issue #14 §0)"),
    # Not in the paper: FedRep's gap on Fashion-MNIST None (issue #14), measured against
    # the reference code's FedRep flags whose values the paper does not report.
    "fedrep_local": Study(
        "fashion_mnist", "none", ("fedrep",),
        (("momentum", (0.0, 0.5, 0.9)), ("body_steps", (5, 25))),
        "FedRep's local steps: heavy-ball momentum x body steps (the reference code's "
        "--momentum and --local_rep_steps)"),
}
# The settings a study may vary: the rest define the run (dataset, seed, T, outputs).
VARIABLE = ("num_clients", "clients_per_round", "participation_prob", "local_steps",
            "client_lr", "server_lr", "prox_mu", "body_steps", "momentum",
            "dirichlet_alpha", "dropout_prob", "server_lr_final_fraction",
            "server_optimizer", "server_lr_schedule", "head_optimizer", "head_step")
PROTOCOLS = (("accuracy", "all clients"), ("sampled_pooled", "sampled clients"),
             ("refit", "all clients after a head refit"))
LOSSES = (("train_loss_last", "at T with the stored heads"),
          ("train_loss_largest_rise", "largest rise above its best so far"),
          ("train_loss_refit_final", "at T after a head refit"))

_STUDY = flags.DEFINE_enum("study", None, sorted(STUDIES), "The ablation.")
_DATASET = flags.DEFINE_string("dataset", None, "Dataset (default: the study's).")
_DEGREE = flags.DEFINE_enum("degree", None, list(PERSONALIZATIONS),
                            "Personalization (default: the study's).")
_ALGORITHMS = flags.DEFINE_list("algorithms", None, "Algorithms (default: the study's).")
_VARY = flags.DEFINE_multi_string(
    "vary", None, "name=v1,v2,...: a setting and its values (at most twice; default: "
    "the study's). The first is the figure's x axis.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds.")
_ROUNDS = flags.DEFINE_integer("rounds", None, "T (default: the paper's).", lower_bound=1)
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 10, "All-client evaluation period.",
                                   lower_bound=1)
_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/ablate", "Where studies go.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
_PROGRESS = flags.DEFINE_bool("progress", True, "A progress bar per run.")
_DOCS_DIR = flags.DEFINE_string(
    "docs_dir", None, "Also copy the tables and figure here, and keep every finished "
    "cell's record under <docs_dir>/ablations (a cell stopped before its end is parked "
    "there and continued by the same command on a fresh clone).")
_AGAINST = flags.DEFINE_list(
    "against", None,
    "Finished runs outside the study (run directories or their records, e.g. the grid's "
    "docs/runs/<dataset>/<degree>/<algorithm>/seed<k>), tabulated and drawn beside its "
    "cells, each at the values of the varied settings its own config.json holds; every "
    "other setting that changes its figures, and its partition, must be the study's "
    "(else exit 2, naming the first that differs).")
_RECOVER_ROWS_FROM = flags.DEFINE_string(
    "recover_rows_from", None, "A study table (results.md) written before its rows were "
    "kept in a .csv beside it: read its cells (2 decimals; all clients and sampled) into "
    "the study's --docs_dir .csv, where rows already there win, redraw the table, stop.")
_TABLES_ONLY = flags.DEFINE_bool(
    "tables_only", False, "Run nothing: tabulate the study's finished cells (runs or "
    "records) and the rows kept before; a cell not finished is left out.")
_SETTINGS = settings.define_flags(__name__, names=("cache_head_features",))
flags.mark_flag_as_required("study")

Vary = tuple[tuple[str, tuple], ...]


def value_text(value) -> str:
  """A varied value as directory names, tables and figures show it."""
  return value if isinstance(value, str) else f"{value:g}"


def categorical(values: tuple) -> bool:
  return any(isinstance(v, str) for v in values)


def text_fields(vary: Vary) -> tuple[str, ...]:
  """The results.csv columns of varied settings that hold text, not numbers."""
  return tuple(name for name, values in vary if categorical(values))


def setting_values(name: str, values_text: str, where: str) -> tuple:
  """`values_text` (v1,v2,...) as values of the varied setting `name`, each parsed and
  checked as the setting's own flag would be. Raises UserError starting with `where`."""
  if name not in VARIABLE:
    raise UserError(f"{where}: {name!r} cannot be varied; choose from "
                    f"{', '.join(VARIABLE)}")
  setting = settings.SETTINGS[name]
  try:
    values = tuple(setting.kind(v) for v in values_text.split(","))
  except ValueError:
    raise UserError(f"{where}: {name} takes {setting.kind.__name__} values, got "
                    f"{values_text!r}") from None
  for value in values:
    problem = setting.problem(value)
    if problem:
      raise UserError(f"{where}: {problem}")
  return values


def parse_vary(texts: Optional[list[str]], default: Vary) -> Vary:
  """`--vary` values as (setting, values). Raises UserError naming the problem."""
  if not texts:
    return default
  if len(texts) > 2:
    raise UserError(f"--vary: at most two settings, got {len(texts)}")
  parsed = []
  for text in texts:
    name, sep, values_text = text.partition("=")
    if not sep or not values_text:
      raise UserError(f"--vary wants name=v1,v2,..., got {text!r}")
    if name in (n for n, _ in parsed):
      raise UserError(f"--vary: {name} given twice")
    values = setting_values(name, values_text, "--vary")
    if len(set(values)) != len(values):
      raise UserError(f"--vary: {name} repeats a value in {values_text!r}")
    parsed.append((name, values))
  return tuple(parsed)


@dataclasses.dataclass(frozen=True)
class Plan:
  study: str
  dataset: str
  degree: str
  algorithms: tuple[str, ...]
  vary: Vary
  seeds: tuple[int, ...]
  rounds: int  # T of every cell
  paper_rounds: int  # the round of the paper's table figure

  @property
  def varied(self) -> str:
    return ",".join(name for name, _ in self.vary)

  @property
  def directory(self) -> str:
    name = f"{self.dataset}_{self.degree}"
    if self.rounds != self.paper_rounds:
      name += f"_T{self.rounds}"
    return os.path.join(_OUTPUT_DIR.value, self.study, name)

  def points(self) -> list[tuple]:
    """Every combination of the varied values, the first setting slowest."""
    return list(itertools.product(*(values for _, values in self.vary)))

  def cell_dir(self, algorithm: str, point: tuple, seed: int) -> str:
    # "+", not ",": a cell's path must survive list flags (compare_runs --runs).
    where = "+".join(f"{name}={value_text(value)}"
                     for (name, _), value in zip(self.vary, point))
    return os.path.join(self.directory, algorithm, where, f"seed{seed}")

  def record_dir(self, algorithm: str, point: tuple, seed: int) -> Optional[str]:
    """Where the cell's record is kept: under <docs_dir>/ablations (None without
    --docs_dir)."""
    if not _DOCS_DIR.value:
      return None
    return os.path.join(_DOCS_DIR.value, "ablations", os.path.relpath(
        self.cell_dir(algorithm, point, seed), _OUTPUT_DIR.value))

  def source(self, algorithm: str, point: tuple, seed: int) -> Optional[str]:
    """The cell's finished run, else its record, else None."""
    return cells.source(self.cell_dir(algorithm, point, seed),
                        self.record_dir(algorithm, point, seed))

  @property
  def docs_name(self) -> str:
    """The study's files under --docs_dir: <docs_name>.md / .png / .csv."""
    return f"ablation_{self.study}_{os.path.basename(self.directory)}"


def make_plan() -> Plan:
  from tff_pflego.config import paper_table_rounds
  study = STUDIES[_STUDY.value]
  dataset = _DATASET.value or study.dataset
  try:
    seeds = tuple(int(s) for s in _SEEDS.value)
  except ValueError:
    raise UserError(f"--seeds takes integers, got {','.join(_SEEDS.value)!r}") from None
  return Plan(study=_STUDY.value, dataset=dataset, degree=_DEGREE.value or study.degree,
              algorithms=tuple(_ALGORITHMS.value or study.algorithms),
              vary=parse_vary(_VARY.value, study.vary), seeds=seeds,
              rounds=_ROUNDS.value or paper_table_rounds(dataset),
              paper_rounds=paper_table_rounds(dataset))


def cell_config(plan: Plan, algorithm: str, point: tuple, seed: int):
  from tff_pflego.experiment import ExperimentConfig
  config = ExperimentConfig(
      dataset=plan.dataset, algorithm=algorithm, personalization=plan.degree, seed=seed,
      rounds=plan.rounds, eval_every=_EVAL_EVERY.value, progress=_PROGRESS.value,
      output_dir=plan.cell_dir(algorithm, point, seed),
      cache_head_features=_SETTINGS["cache_head_features"].value,
      **{name: value for (name, _), value in zip(plan.vary, point)})
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  return config


def cell_row(plan: Plan, algorithm: str, point: tuple, seed: int) -> dict:
  row = figures_row(plan, algorithm, point, seed, plan.source(algorithm, point, seed))
  row["run_dir"] = cells.kept_at(row["run_dir"], plan.record_dir(algorithm, point, seed))
  return row


def figures_row(plan: Plan, algorithm: str, point: tuple, seed: int,
                directory: str) -> dict:
  """The results.csv row of the finished run in `directory` at `point`."""
  return dict(dataset=plan.dataset, degree=plan.degree, algorithm=algorithm, seed=seed,
              varied=plan.varied,
              **{name: value for (name, _), value in zip(plan.vary, point)},
              **cells.run_figures(directory), paper_rounds=plan.paper_rounds,
              run_dir=directory, partition_fingerprint=records.partition_fingerprint(directory))


# The varied settings that change the partition (the clients' data), not only training.
PARTITION_SETTINGS = ("num_clients", "dirichlet_alpha")
# What a finished run's figures do not depend on besides what its training ignores:
# where it ran, and how often all clients were scored before its last WINDOW rounds
# (each of those is scored) or whether they were scored after a head refit too.
_FIGURE_INDEPENDENT = RUN_INDEPENDENT + ("eval_every", "refit_eval")


def outside_row(plan: Plan, directory: str) -> dict:
  """The row of `directory`, a finished run outside the study (`--against`), at the
  values of the varied settings its config.json holds: marked `outside_study`. Raises
  UserError if it is unfinished or differs from the study's cell at those values in a
  setting its figures depend on."""
  where = f"--against {directory}"
  if not records.finished(directory):
    raise UserError(f"{where}: not a finished run ({run_files.SUMMARY_FILE} is missing)")
  theirs = load_run_config(directory, "--against")
  point = tuple(getattr(theirs, name) for name, _ in plan.vary)
  at = "+".join(f"{name}={value_text(v)}" for (name, _), v in zip(plan.vary, point))
  ours = resolve(without_output(cell_config(plan, theirs.algorithm, point, theirs.seed)))
  ignored = set(_FIGURE_INDEPENDENT) | (
      ignored_in_training(theirs.algorithm, theirs.server_lr_schedule)
      & ignored_in_training(theirs.algorithm, ours.server_lr_schedule))
  for field in dataclasses.fields(ours):
    mine, its = (json.dumps(getattr(c, field.name)) for c in (ours, theirs))
    if field.name not in ignored and mine != its:
      raise UserError(f"{where}: its {field.name} is {its}, the study's cell at {at} "
                      f"has {mine}")
  return dict(figures_row(plan, theirs.algorithm, point, theirs.seed, directory),
              outside_study=1, eval_every=theirs.eval_every)


def check_outside(plan: Plan, outside: list[dict], kept: list[dict]) -> None:
  """Raises UserError if a run outside the study (`outside_row`) stands where a cell of
  the study does (planned, or finished among the `kept` rows) or another such run
  stands, or trained on another partition than the study's cells of its seed."""
  cells_at = {(a, s) + p for a in plan.algorithms for p in plan.points() for s in plan.seeds}
  cells_at |= {_row_key(plan, r) for r in kept if not r.get("outside_study")}
  seen = {}
  for row in outside:
    key = _row_key(plan, row)
    if key in cells_at or key in seen:
      other = seen.get(key, "a cell of the study")
      raise UserError(f"--against {row['run_dir']}: {other} stands at its "
                      f"{', '.join(f'{n}={value_text(row[n])}' for n, _ in plan.vary)}")
    seen[key] = row["run_dir"]
    partition = tuple(row[n] for n, _ in plan.vary if n in PARTITION_SETTINGS)
    for r in kept:
      if (r["seed"] == row["seed"] and not r.get("outside_study")
          and tuple(r[n] for n, _ in plan.vary if n in PARTITION_SETTINGS) == partition
          and _partition_of(r) not in (None, row["partition_fingerprint"])):
        raise UserError(f"--against {row['run_dir']}: trained on partition "
                        f"{str(row['partition_fingerprint'])[:12]}, the study's cell "
                        f"{r['run_dir']} on {_partition_of(r)[:12]}")


def _partition_of(row: dict) -> Optional[str]:
  """A kept row's partition fingerprint: its own, else its run's if that is still
  there (rows kept before the fingerprint was), else None."""
  if row.get("partition_fingerprint"):
    return row["partition_fingerprint"]
  run = row.get("run_dir")
  return records.partition_fingerprint(run) if run and records.finished(run) else None


def rows_at(plan: Plan, rows: list[dict], algorithm: str, point: tuple) -> list[dict]:
  return [r for r in rows if r["algorithm"] == algorithm
          and all(r[name] == value for (name, _), value in zip(plan.vary, point))]


def summary(plan: Plan, rows: list[dict], algorithm: str, point: tuple,
            metric: str) -> Optional[grid.Summary]:
  return grid.summarize(rows_at(plan, rows, algorithm, point), plan.dataset,
                        plan.degree, algorithm, metric)


def outside_study(plan: Plan, rows: list[dict], algorithm: str, point: tuple) -> bool:
  """Whether the figures at `point` come from a run outside the study (`--against`)."""
  return any(r.get("outside_study") for r in rows_at(plan, rows, algorithm, point))


_OUTSIDE_MARK = " †"


def outside_notes(rows: list[dict], eval_every: int) -> list[str]:
  """The table's footnote on its runs from outside the study, if any."""
  return [f"{_OUTSIDE_MARK.strip()} not a cell of the study: `{r['run_dir']}`"
          + (f" (all clients scored every {r['eval_every']:g} rounds, the study's every "
             f"{eval_every}: its largest rise of L(ψ) is read at those rounds)"
             if r.get("eval_every") not in (None, eval_every) else "") + "  "
          for r in rows if r.get("outside_study")]


def _line_groups(plan: Plan) -> list[tuple[str, tuple]]:
  """(label, second value or ()) for each table row / figure line of an algorithm."""
  if len(plan.vary) == 1:
    return [("", ())]
  name, values = plan.vary[1]
  return [(f"{name}={value_text(value)}", (value,)) for value in values]


def write_table(plan: Plan, rows: list[dict]) -> None:
  first_name, first_values = plan.vary[0]
  lines = [f"# Ablation `{plan.study}`: {STUDIES[plan.study].title}", "",
           f"{plan.dataset}, {plan.degree}; every other setting the paper's; test "
           f"accuracy (%) at T = {plan.rounds}"
           + (f" (shortened: the paper's T is {plan.paper_rounds})"
              if plan.rounds < plan.paper_rounds else "")
           + "; mean ± std over the last 10 evaluations, or over seeds (n=).", ""]
  notes = outside_notes(rows, _EVAL_EVERY.value)
  lines += notes + ([""] if notes else [])
  for metric, protocol in PROTOCOLS:
    lines += [f"## {protocol}", "",
              "| algorithm | " + " | ".join(f"{first_name}={value_text(v)}"
                                            for v in first_values)
              + " |", "|---" * (len(first_values) + 1) + "|"]
    for algorithm in plan.algorithms:
      for label, second in _line_groups(plan):
        texts = [summary(plan, rows, algorithm, (v,) + second, metric)
                 for v in first_values]
        marks = [_OUTSIDE_MARK if outside_study(plan, rows, algorithm, (v,) + second)
                 else "" for v in first_values]
        lines.append(f"| {algorithm}{' ' + label if label else ''} | "
                     + " | ".join("—" if s is None else s.text() + mark
                                  for s, mark in zip(texts, marks)) + " |")
    lines.append("")
  lines += loss_table(plan, rows)
  with open(os.path.join(plan.directory, "results.md"), "w") as f:
    f.write("\n".join(lines))


def loss_table(plan: Plan, rows: list[dict]) -> list[str]:
  """L(psi) over all clients with their stored heads at T, its largest rise above its
  best so far during the run, and L(psi) at T after every client refits its head: does
  the objective PFLEGO minimizes rise (issue #14 §0)? The mean over seeds."""
  first_name, first_values = plan.vary[0]
  lines = ["## L(ψ) over all clients: " + " / ".join(title for _, title in LOSSES), "",
           "| algorithm | " + " | ".join(f"{first_name}={value_text(v)}"
                                        for v in first_values) + " |",
           "|---" * (len(first_values) + 1) + "|"]
  for algorithm in plan.algorithms:
    for label, second in _line_groups(plan):
      texts = []
      for value in first_values:
        found = rows_at(plan, rows, algorithm, (value,) + second)
        means = [np.mean([np.nan if r.get(key) is None else r[key] for r in found])
                 if found else np.nan for key, _ in LOSSES]
        mark = (_OUTSIDE_MARK if outside_study(plan, rows, algorithm, (value,) + second)
                else "")
        texts.append("—" if all(np.isnan(means)) else
                     f"{means[0]:.3g} / {means[1]:.2f}x / {means[2]:.3g}{mark}")
      lines.append(f"| {algorithm}{' ' + label if label else ''} | "
                   + " | ".join(texts) + " |")
  return lines + [""]


def plot(plan: Plan, rows: list[dict]) -> None:
  """All-client accuracy, sampled accuracy and final L(psi) against the first setting."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  first_name, first_values = plan.vary[0]
  panels = [None] if len(plan.vary) == 1 else list(plan.algorithms)
  quantities = [(metric, title)  # rows recovered from an old table lack some
                for metric, title in PROTOCOLS + (("train_loss", "train loss at the end"),)
                if any(r.get(f"{metric}_mean") is not None and np.isfinite(
                    r[f"{metric}_mean"]) for r in rows)]
  fig, axes = plt.subplots(len(quantities), len(panels), squeeze=False, sharey="row",
                           figsize=(max(4.6 * len(panels) + 1, 8), 3.2 * len(quantities)),
                           layout="constrained")
  if categorical(first_values):  # e.g. constant, cosine: evenly spaced positions
    position = {v: float(i) for i, v in enumerate(first_values)}
    log_x = False
  else:
    position = {v: v for v in first_values}
    spread = max(first_values) / min(first_values) if min(first_values) > 0 else 1
    log_x = spread >= 8  # e.g. 0.002, 0.006, 0.02: log-spaced values
  for column, panel in enumerate(panels):
    for algorithm in [panel] if panel else plan.algorithms:
      for group_index, (label, second) in enumerate(_line_groups(plan)):
        for row, (metric, title) in enumerate(quantities):
          found = [(v, summary(plan, rows, algorithm, (v,) + second, metric))
                   for v in first_values]
          found = [(v, s) for v, s in found if s is not None]
          if not found:
            continue
          scale = 1 if metric == "train_loss" else 100
          x = [position[v] for v, _ in found]
          y = np.array([scale * s.mean for _, s in found])
          err = np.nan_to_num([scale * s.std for _, s in found])
          name = label if panel else algorithm
          color = f"C{group_index}" if panel else f"C{plan.algorithms.index(algorithm)}"
          ax = axes[row][column]
          ax.errorbar(x, y, yerr=err if err.any() else None, marker="o", color=color,
                      lw=2.4 if algorithm == "pflego" and not panel else 1.5,
                      label=name, capsize=3)
          outside = [i for i, (v, _) in enumerate(found)
                     if outside_study(plan, rows, algorithm, (v,) + second)]
          if outside:  # a run from outside the study: a hollow point
            ax.plot([x[i] for i in outside], y[outside], ls="none", marker="o", ms=7,
                    mfc="white", mec=color, mew=1.5, zorder=3)
          ax.set(ylabel=title + ("" if metric == "train_loss" else " (%)"))
          if metric == "train_loss":
            ax.set_yscale("log")  # plain numbers (2.5, not 2.5 x 10^0) within a decade
            ax.yaxis.set_major_formatter(matplotlib.ticker.LogFormatter())
            ax.yaxis.set_minor_formatter(matplotlib.ticker.LogFormatter(
                labelOnlyBase=False, minor_thresholds=(2, 0.5)))
          if log_x:
            ax.set_xscale("log")
          ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
          ax.set_xticks([position[v] for v in first_values],
                        [value_text(v) for v in first_values])
          ax.grid(alpha=0.3)
    for algorithm in [panel] if panel else plan.algorithms:
      paper = PAPER_ACCURACY.get((plan.dataset, algorithm, plan.degree))
      color = "0.4" if panel else f"C{plan.algorithms.index(algorithm)}"
      for row, (metric, _) in enumerate(quantities if paper else ()):
        if metric not in ("accuracy", "sampled_pooled"):
          continue
        # The paper's table figure, on both accuracy panels (its protocol: sampled).
        axes[row][column].axhline(100 * paper, ls="--", lw=1, color=color,
                                  label=f"paper: {algorithm} {100 * paper:.2f}")
    axes[0][column].set_title(panel or "")
    axes[-1][column].set_xlabel(first_name)
    if axes[0][column].get_legend_handles_labels()[0]:
      axes[0][column].legend(fontsize=8)
  low, high = min(position.values()), max(position.values())
  pad = 1.25 if log_x else 0.5 if categorical(first_values) else 0.05 * (high - low or 1)
  for ax in axes.flat:  # the same x range in every panel
    ax.set_xlim(*((low / pad, high * pad) if log_x else (low - pad, high + pad)))
  shortened = (f", shortened: T = {plan.rounds} of the paper's {plan.paper_rounds}"
               if plan.rounds < plan.paper_rounds else f", T = {plan.rounds}")
  fig.suptitle(f"Ablation {plan.study}: {plan.dataset}, {plan.degree}{shortened}\n"
               "points: mean of the last 10 evaluations; bars: std across seeds\n"
               "(one seed: across those evaluations)"
               + ("; hollow: a run outside the study (--against)"
                  if any(r.get("outside_study") for r in rows) else ""), fontsize=10)
  fig.savefig(os.path.join(plan.directory, "ablation.png"), dpi=110)
  plt.close(fig)


def _row_key(plan: Plan, row: dict) -> tuple:
  return (row["algorithm"], row["seed"]) + tuple(row[name] for name, _ in plan.vary)


def _kept_results(plan: Plan) -> list[str]:
  """Where the study's results.csv is kept: in its directory, and under --docs_dir
  (which outlives the machine)."""
  paths = [os.path.join(plan.directory, "results.csv")]
  if _DOCS_DIR.value:
    paths.append(os.path.join(_DOCS_DIR.value, plan.docs_name + ".csv"))
  return paths


def read_rows(plan: Plan, path: str) -> list[dict]:
  """A study's results.csv (none: []), each varied setting as its own kind (an int
  setting as 50, not the csv reader's 50.0)."""
  rows = grid.read_results(path, text_fields(plan.vary))
  for row in rows:
    for name, _ in plan.vary:
      if row.get(name) is not None:
        row[name] = settings.SETTINGS[name].kind(row[name])
  return rows


def kept_rows(plan: Plan) -> list[dict]:
  """The study's rows kept by earlier invocations that vary the same settings (the
  --docs_dir copy first, so that the run directory's own rows win)."""
  rows = {}
  for path in reversed(_kept_results(plan)):
    rows.update((_row_key(plan, r), r)
                for r in read_rows(plan, path)
                if r.get("varied") == plan.varied)
  return list(rows.values())


def tabulate(plan: Plan, fresh: list[dict]) -> None:
  """results.csv, results.md and ablation.png of every finished cell of the study
  that varies the same settings: the earlier invocations' rows are kept (a fresh cell
  replaces its row), so runs of other values or algorithms add to one table. With
  --docs_dir the three are also copied there after every cell."""
  rows = {_row_key(plan, r): r for r in kept_rows(plan)}
  rows.update((_row_key(plan, r), r) for r in fresh)
  rows = list(rows.values())
  if not rows:
    return
  fields = list(dict.fromkeys(k for r in rows for k in r))
  grid.write_results(_kept_results(plan)[0], rows, fields)
  shown = dataclasses.replace(
      plan, vary=tuple((name, tuple(sorted({r[name] for r in rows})))
                       for name, _ in plan.vary),
      algorithms=tuple(dict.fromkeys(plan.algorithms + tuple(
          r["algorithm"] for r in rows))))
  write_table(shown, rows)
  plot(shown, rows)
  if _DOCS_DIR.value:
    os.makedirs(_DOCS_DIR.value, exist_ok=True)
    for name, suffix in (("results.md", "md"), ("ablation.png", "png"),
                         ("results.csv", "csv")):
      shutil.copyfile(os.path.join(plan.directory, name),
                      os.path.join(_DOCS_DIR.value, f"{plan.docs_name}.{suffix}"))


def unkept_docs_table(plan: Plan) -> Optional[str]:
  """The study's --docs_dir table if no .csv of its rows lies beside it (written before
  rows were kept): tabulating would replace it with this invocation's rows only."""
  if not _DOCS_DIR.value:
    return None
  table = os.path.join(_DOCS_DIR.value, plan.docs_name + ".md")
  kept = os.path.join(_DOCS_DIR.value, plan.docs_name + ".csv")
  return table if os.path.exists(table) and not os.path.exists(kept) else None


_TITLE = re.compile(r"^# Ablation `(?P<study>\w+)`", re.M)
_SETTING_LINE = re.compile(r"^(?P<dataset>\w+), (?P<degree>\w+); .*?at T = (?P<rounds>\d+)",
                           re.M)
_CELL = re.compile(r"^(?P<mean>-?\d+\.\d+) ± (?P<std>\d+\.\d+|nan)"
                   r"( \(shortened: T=\d+\))?$")


def _setting_value(text: str, where: str) -> tuple[str, object]:
  name, sep, value = text.partition("=")
  values = setting_values(name, value, where) if sep else ()
  if len(values) != 1:
    raise UserError(f"{where}: {text!r} is not one varied setting=value")
  return name, values[0]


def rows_from_table(plan: Plan, text: str, source: str) -> list[dict]:
  """The cells of a study table (`write_table`'s format) as results.csv rows: for every
  protocol the table has, `<metric>_mean` / `<metric>_std` from its "mean ± std" (in
  %, 2 decimals), one seed each (`plan.seeds[0]`). Raises UserError naming what does
  not fit the plan: another study, dataset, degree or setting; a mean over seeds."""
  title, setting = _TITLE.search(text), _SETTING_LINE.search(text)
  if not title or not setting:
    raise UserError(f"{source}: not a study table (no '# Ablation' title and "
                    "'<dataset>, <degree>; ... at T = <rounds>' line)")
  found = (title["study"], setting["dataset"], setting["degree"])
  if found != (plan.study, plan.dataset, plan.degree):
    raise UserError(f"{source} holds study {found[0]} on {found[1]} {found[2]}, this "
                    f"invocation {plan.study} on {plan.dataset} {plan.degree}")
  metrics = {f"## {title}": metric for metric, title in PROTOCOLS}
  rows: dict[tuple, dict] = {}
  metric, columns = None, None
  for number, line in enumerate(text.splitlines(), 1):
    where = f"{source}:{number}"
    if line.startswith("## "):
      metric, columns = metrics.get(line.strip()), None
      continue
    if metric is None or not line.startswith("|") or line.startswith("|---"):
      continue
    cells_text = [c.strip() for c in line.strip().strip("|").split("|")]
    if columns is None:  # the header: algorithm | name=value | ...
      columns = [_setting_value(c, where) for c in cells_text[1:]]
      continue
    algorithm, *second = cells_text[0].split(" ")
    second = [_setting_value(c, where) for c in second]
    names = tuple(name for name, _ in columns[:1] + second)
    if names != tuple(name for name, _ in plan.vary):
      raise UserError(f"{where}: the table varies {','.join(names)}, this invocation "
                      f"{plan.varied}")
    for (name, value), cell in zip(columns, cells_text[1:]):
      if cell == "—":
        continue
      match = _CELL.match(cell)
      if not match:
        raise UserError(f"{where}: {cell!r} is not one seed's 'mean ± std' (a mean "
                        "over seeds cannot be split into its seeds)")
      point = dict([(name, value)] + second)
      key = (algorithm,) + tuple(point.values())
      row = rows.setdefault(key, dict(
          dataset=plan.dataset, degree=plan.degree, algorithm=algorithm,
          seed=plan.seeds[0], varied=plan.varied, **point,
          rounds=int(setting["rounds"]), paper_rounds=plan.paper_rounds,
          run_dir=f"recovered from {source} (2 decimals; its runs are gone)"))
      row[f"{metric}_mean"] = float(match["mean"]) / 100
      row[f"{metric}_std"] = float(match["std"]) / 100
  return list(rows.values())


def recover_rows(plan: Plan, source: str) -> None:
  """`rows_from_table` of `source` added to the study's --docs_dir .csv (rows already
  there win); the table and figure redrawn from all of them."""
  if not _DOCS_DIR.value:
    raise UserError("--recover_rows_from needs --docs_dir (where the rows are kept)")
  try:
    with open(source) as f:
      text = f.read()
  except OSError as e:
    raise UserError(f"--recover_rows_from: cannot read {source}: "
                    f"{e.strerror or e}") from None
  recovered = rows_from_table(plan, text, source)
  kept = os.path.join(_DOCS_DIR.value, plan.docs_name + ".csv")
  rows = {_row_key(plan, r): r for r in recovered}
  rows.update((_row_key(plan, r), r)
              for r in read_rows(plan, kept))
  fields = list(dict.fromkeys(k for r in rows.values() for k in r))
  os.makedirs(_DOCS_DIR.value, exist_ok=True)
  grid.write_results(kept, list(rows.values()), fields)
  os.makedirs(plan.directory, exist_ok=True)
  tabulate(plan, [])
  print(f"{len(recovered)} rows read from {source} into {kept}", flush=True)


def run_cell(plan: Plan, label: str, algorithm: str, point: tuple, seed: int) -> bool:
  """Runs the cell unless another live process claims it (False); a run parked in its
  record is continued, and one that stops before its end is parked there
  (`cells.run_or_continue`); a finished run's record is kept."""
  directory, record = plan.cell_dir(algorithm, point, seed), plan.record_dir(
      algorithm, point, seed)
  with records.claim(directory) as mine:
    if not mine:
      print(f"{label}: being run by process {records.holder(directory)}, skipped",
            flush=True)
      return False
    if plan.source(algorithm, point, seed) is None:  # not finished meanwhile
      print(f"{label}: running", flush=True)
      cells.run_or_continue(cell_config(plan, algorithm, point, seed), record)
  return True


def main(argv) -> None:
  from tff_pflego import experiment
  plan = make_plan()
  if _RECOVER_ROWS_FROM.value:
    recover_rows(plan, _RECOVER_ROWS_FROM.value)
    return
  unkept = unkept_docs_table(plan)
  if unkept:
    raise UserError(
        f"{unkept} has no .csv of its rows beside it, so this study would replace its "
        f"table; keep them first: the same command with --recover_rows_from={unkept}")
  work = [(a, p, s) for a in plan.algorithms for p in plan.points() for s in plan.seeds]
  if _TABLES_ONLY.value:
    work = [cell for cell in work if plan.source(*cell) is not None]
  for cell in work:  # every cell to run checked before any runs
    if plan.source(*cell) is None:
      experiment.resolve(cells.resuming(cell_config(plan, *cell)))
  outside = [outside_row(plan, directory) for directory in _AGAINST.value or ()]
  check_outside(plan, outside, kept_rows(plan))
  os.makedirs(plan.directory, exist_ok=True)
  rows = list(outside)
  for number, cell in enumerate(work, 1):
    directory, record = plan.cell_dir(*cell), plan.record_dir(*cell)
    label = f"[{number}/{len(work)}] {os.path.relpath(directory, plan.directory)}"
    if plan.source(*cell) is not None:
      print(f"{label}: done, skipped", flush=True)
    elif not run_cell(plan, label, *cell):
      continue
    if record and cells.finished(directory):
      records.keep(directory, record, cells.RECORDED)
    rows.append(cell_row(plan, *cell))
    tabulate(plan, rows)
  if len(rows) == len(outside):  # no cell of the study tabulated: every one claimed by
    tabulate(plan, rows)        # other processes; the table from the records
  results = os.path.join(plan.directory, "results.md")
  if os.path.exists(results):
    print(open(results).read())


if __name__ == "__main__":
  cli.run_main(main)
