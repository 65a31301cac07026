r"""The unified framework's experiments (spec UNIFIED.md 4.1-4.3), resumable.

Synthetic (default): every optimizer on synthetic MX2 (sigma 0.1, 0.3, 1) and EWS
(sigma 5, 10, 15), 1000 communications each:

  python binaries/reproduce_unified.py --output_dir=runs/unified --docs_dir=docs/unified

Real data: objective x c x optimizer on each dataset (20 devices, c classes each):

  python binaries/reproduce_unified.py --datasets=mnist --objectives=mt2,mx2,apfl2 \
      --classes=2,4,8 --algorithms=lsgd_pfl,ascd_pfl,asvrcd_pfl

Ablations (spec 4.4-4.6): `--p_w=0.1,0.3,...` runs each cell at those w-step
probabilities too (eta recomputed for each), `--no_reparametrize` also without the
w / sqrt(M) reparametrization, `--mt_alpha=0.1,10,...` MT2 at those relaxations alpha
(each its own F*), `--devices_per_round=5,10` with r of the M devices per round (the
optimizers that allow partial participation). `--datasets=cifar10_colour`: CIFAR-10
with its 3072 colour features.

A run whose summary.json exists is read, not rerun, and so is a run recorded under
<docs_dir>/runs: every finished run's summary.json and metrics (gzipped) are kept there
(`--keep_records`, in git), so a fresh clone redraws every figure and table without
running anything. Several invocations can share an --output_dir: a cell being run by
another live process is skipped (`<run>.claim`). Writes <docs_dir>/<dataset>.png
(relative suboptimality, and estimation error or test accuracy, against
communications; one column per problem), <docs_dir>/<dataset>_ablations.png (the
p_w and reparametrization variants beside the theory's run) and
<docs_dir>/<dataset>_repetitions.png/.json (cells run at several seeds: the paper's
view, raw F and the estimation error with mean +-1 and +-2 std bands) and
<docs_dir>/results.md (communications to reach 1e-2 / 1e-4 / 1e-6, final values,
seconds per 1000 communications; on real data, per problem, how many times fewer
communications ASCD needs than LSGD and where ASVRCD ends against ASCD) over every
run found.
"""

from __future__ import annotations

from tff_pflego import cli  # pylint: disable=g-bad-import-order

import dataclasses
import functools
import json
import os
from typing import Optional

from absl import flags

from tff_pflego import records
from tff_pflego.errors import UserError
from tff_pflego.unified import registry, run_config

WORKER_RETRIES = 2  # new workers for a grid whose worker died

flags.DEFINE_string("output_dir", "runs/unified", "Where each run's outputs go.")
flags.DEFINE_string("docs_dir", "docs/unified", "Where the figures and table go.")
flags.DEFINE_bool("keep_records", True,
                  "Keep each finished run's summary and metrics under <docs_dir>/runs and "
                  "read them back (a recorded cell is not run again).")
flags.DEFINE_list("datasets", list(run_config.SYNTHETIC), "Problems to run.")
flags.DEFINE_list("heterogeneity", [], "Synthetic sigma values (default: the paper's).")
flags.DEFINE_list("objectives", ["mt2", "mx2", "apfl2"], "Real data: objectives.")
flags.DEFINE_list("classes", ["2", "4", "8"], "Real data: classes per device c.")
flags.DEFINE_list("algorithms", list(registry.OPTIMIZERS), "Optimizers to run.")
flags.DEFINE_integer("rounds", 1000, "Communications per run.", lower_bound=1)
flags.DEFINE_integer("eval_every", 5, "Communications between evaluations.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "The optimizers' seed.")
flags.DEFINE_integer("repetitions", 1,
                     "Run each cell at seeds --seed, --seed + 1, ... (the optimizers' "
                     "draws; the data stay): figures draw the median and the min-max "
                     "band, results.md adds a table over the seeds.", lower_bound=1)
flags.DEFINE_list("p_w", [], "Ablation: also run at these w-step probabilities.")
flags.DEFINE_list("mt_alpha", [],
                  "Ablation (spec 4.6): also run MT2 at these relaxations alpha.")
flags.DEFINE_list("devices_per_round", [],
                  "Partial participation: also run at these r (of M) devices per round, "
                  "the optimizers that allow it.")
flags.DEFINE_bool("no_reparametrize", False,
                  "Ablation: also run without the w / sqrt(M) reparametrization.")


@dataclasses.dataclass(frozen=True)
class Cell:
  dataset: str
  objective: str
  sigma: Optional[float]  # synthetic
  classes: Optional[int]  # real data
  algorithm: str
  p_w: Optional[float] = None  # None: the theory's
  reparametrize: bool = True
  mt_alpha: Optional[float] = None  # None: the paper's 1
  colour: bool = False  # CIFAR-10's 3072 colour features
  devices_per_round: Optional[int] = None  # None: every device (the paper's)
  seed: int = 0  # the optimizers' draws (not part of the label: repetitions)

  @property
  def name(self) -> str:
    """The dataset as --datasets names it (cifar10_colour: CIFAR-10 in colour)."""
    return self.dataset + ("_colour" if self.colour else "")

  @property
  def variant(self) -> str:
    """'' for the theory's settings, else what differs."""
    parts = ([f"p_w={self.p_w:g}"] if self.p_w is not None else []) + (
        [] if self.reparametrize else ["plain w"]) + (
        [f"alpha={self.mt_alpha:g}"] if self.mt_alpha is not None else []) + (
        [f"r={self.devices_per_round}"] if self.devices_per_round is not None else [])
    return ", ".join(parts)

  @property
  def label(self) -> str:
    return f"{self.algorithm} ({self.variant})" if self.variant else self.algorithm

  @property
  def run_name(self) -> str:
    suffix = (f"_pw{self.p_w:g}" if self.p_w is not None else "") + (
        "" if self.reparametrize else "_plain") + (
        f"_alpha{self.mt_alpha:g}" if self.mt_alpha is not None else "") + (
        f"_r{self.devices_per_round}" if self.devices_per_round is not None else "") + (
        f"_seed{self.seed}" if self.seed else "")
    return self.algorithm + suffix

  @property
  def record_dir(self) -> Optional[str]:
    """Where this cell's record is kept (None: --nokeep_records)."""
    root = _record_root()
    return os.path.join(root, self.problem, self.run_name) if root else None

  def done(self) -> bool:
    """Whether the cell's run or its record is finished."""
    return records.finished(self.config().output_dir) or bool(
        self.record_dir and records.finished(self.record_dir))

  @property
  def problem(self) -> str:
    if self.sigma is not None:
      return f"{self.dataset}_sigma{self.sigma:g}"
    return f"{self.name}_{self.objective}_c{self.classes}"

  def sort_key(self) -> tuple:
    return (self.name, self.problem, self.algorithm, self.mt_alpha or 0, self.variant,
            self.seed)

  @property
  def title(self) -> str:
    if self.sigma is not None:
      return f"{self.objective.upper()}, sigma = {self.sigma:g}"
    return f"{self.objective.upper()}, c = {self.classes}"

  def config(self) -> run_config.UnifiedConfig:
    f = flags.FLAGS
    options = (dict(heterogeneity=self.sigma) if self.sigma is not None else
               dict(objective=self.objective, classes_per_device=self.classes))
    return run_config.UnifiedConfig(
        dataset=self.dataset, algorithm=self.algorithm, rounds=f.rounds, seed=self.seed,
        eval_every=f.eval_every, output_dir=os.path.join(f.output_dir, self.problem,
                                                         self.run_name),
        p_w=self.p_w, reparametrize=self.reparametrize, mt_alpha=self.mt_alpha,
        colour=self.colour, devices_per_round=self.devices_per_round, progress=True,
        **options)


def _cells() -> list[Cell]:
  from tff_pflego.unified import synthetic
  f = flags.FLAGS
  cells = []
  for name in f.datasets:
    dataset, colour = (("cifar10", True) if name == "cifar10_colour" else (name, False))
    if dataset not in run_config.DATASETS:
      raise UserError(f"--datasets: unknown problem {name!r}")
    if dataset in run_config.SYNTHETIC:
      objective = dataset.split("_", 1)[-1]
      problems = [(objective, float(s), None) for s in
                  (f.heterogeneity or synthetic.PAPER_HETEROGENEITY[dataset])]
    else:
      problems = [(o, None, int(c)) for o in f.objectives for c in f.classes]
    for objective, sigma, classes in problems:
      for algorithm in f.algorithms:
        if algorithm not in registry.OPTIMIZERS:
          raise UserError(f"--algorithms: unknown optimizer {algorithm!r}")
        if not registry.supports(algorithm, objective):
          continue
        for seed in range(f.seed, f.seed + f.repetitions):
          cells.append(Cell(dataset, objective, sigma, classes, algorithm, colour=colour,
                            seed=seed))
        cell = functools.partial(Cell, dataset, objective, sigma, classes, algorithm,
                                 colour=colour, seed=f.seed)
        cells.extend(cell(p_w=float(p)) for p in f.p_w)
        if f.no_reparametrize:
          cells.append(cell(reparametrize=False))
        if objective == "mt2":
          cells.extend(cell(mt_alpha=float(a)) for a in f.mt_alpha)
        if not registry.partial_participation_problem(algorithm, frozen=True):
          cells.extend(cell(devices_per_round=int(r)) for r in f.devices_per_round)
  return cells


def main(argv: list[str]) -> None:
  del argv
  from tff_pflego import runtime
  from tff_pflego.unified import experiment
  cells = _cells()
  for cell in cells:
    cell.config().check()
  run_cells(cells, experiment.run, runtime.execution_context)
  results = _collect()
  docs = flags.FLAGS.docs_dir
  os.makedirs(docs, exist_ok=True)
  for dataset in sorted({c.name for c in results}):
    _plot({c: r for c, r in results.items() if c.name == dataset and not c.variant},
          os.path.join(docs, f"{dataset}.png"))
    varied = {(c.problem, c.algorithm) for c in results
              if c.name == dataset and c.variant}
    if varied:
      _plot({c: r for c, r in results.items() if (c.problem, c.algorithm) in varied},
            os.path.join(docs, f"{dataset}_ablations.png"))
    repeated = _repeated({c: r for c, r in results.items() if c.name == dataset})
    if repeated:
      optima = {c.problem: s["final"]["optimum"] for c, (s, _) in results.items()}
      _plot_repetitions(repeated, optima, os.path.join(docs, f"{dataset}_repetitions"))
  _table(results, os.path.join(docs, "results.md"))
  if flags.FLAGS.mt_alpha:
    _alpha_table(results, os.path.join(docs, "mt_alpha.md"))
  print(f"wrote {docs}/<dataset>.png and {docs}/results.md")


def run_cells(cells: list[Cell], run, context, retries: int = WORKER_RETRIES) -> None:
  """Runs every cell not done (`Cell.done`), in order, inside `context()`, and keeps
  each finished run's record. A run cut short (no summary.json) has no checkpoint: it
  starts again. A cell claimed by another live process is skipped; one finished by
  another process since this invocation began is not run again. When the TFF worker
  dies (a crash outside the run's control: a segfault in its gRPC server thread ended
  a grid after 31 runs), a new context (a new worker) runs the interrupted cell again,
  up to `retries` times in all."""
  from tff_pflego.errors import WorkerLostError
  pending = [c for c in cells if not c.done()]
  while pending:
    try:
      with context():
        while pending:
          cell, config = pending[0], pending[0].config()
          with records.claim(config.output_dir) as mine:
            if not mine:
              print(f"{cell.problem} {cell.label}: being run by process "
                    f"{records.holder(config.output_dir)}, skipped")
            elif not cell.done():
              print(f"{cell.problem} {cell.label}: {config.rounds} communications")
              run(dataclasses.replace(config, overwrite=True))
              if cell.record_dir:
                records.keep(config.output_dir, cell.record_dir)
          pending.pop(0)
    except WorkerLostError as e:
      if retries == 0:
        raise
      retries -= 1
      print(f"  {e}; a new worker runs the cell again", flush=True)


def _finished_runs(root: str) -> dict[str, str]:
  """<problem>/<run> -> its directory, for every finished run or record under root."""
  found = {}
  for problem in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    if not os.path.isdir(os.path.join(root, problem)):
      continue
    for name in sorted(os.listdir(os.path.join(root, problem))):
      if records.finished(os.path.join(root, problem, name)):
        found[f"{problem}/{name}"] = os.path.join(root, problem, name)
  return found


def _record_root() -> Optional[str]:
  """Where the runs' records are kept (None: --nokeep_records)."""
  options = flags.FLAGS
  return os.path.join(options.docs_dir, "runs") if options.keep_records else None


def _collect() -> dict[Cell, tuple[dict, list[dict]]]:
  """Every finished run: the records under <docs_dir>/runs, and under --output_dir
  (this invocation's and earlier ones; a run there stands for its record, which it
  brings up to date)."""
  record_root = _record_root()
  runs = _finished_runs(flags.FLAGS.output_dir)
  if record_root:
    for key, run_dir in runs.items():
      records.keep(run_dir, os.path.join(record_root, key))
    runs = {**_finished_runs(record_root), **runs}
  results = {}
  for key in sorted(runs):
    run_dir = runs[key]
    with open(os.path.join(run_dir, "summary.json")) as f:
      summary = json.load(f)
    settings = summary["settings"]
    synthetic_run = settings["dataset"] in run_config.SYNTHETIC
    cell = Cell(settings["dataset"], summary["objective"]["kind"],
                settings["heterogeneity"] if synthetic_run else None,
                None if synthetic_run else settings["classes_per_device"],
                summary["algorithm"], settings.get("p_w"),
                settings.get("reparametrize", True), settings.get("mt_alpha"),
                settings.get("colour", False), settings.get("devices_per_round"),
                settings["seed"])
    results[cell] = (summary, records.read_metrics(run_dir))
  return results


def _sorted(results: dict) -> list:
  return sorted(results.items(), key=lambda item: item[0].sort_key())


def _by_seeds(results: dict) -> dict:
  """(a seed's cell, problem) -> the metrics rows of each seed's run of that cell."""
  groups = {}
  for cell, (_, rows) in _sorted(results):
    key = (dataclasses.replace(cell, seed=0), cell.problem)
    groups.setdefault(key, []).append(rows)
  return groups


def _draw(ax, runs: list, value, label: str, style: dict) -> None:
  """One run as a line; several seeds as their median and a min-max band."""
  import numpy as np
  length = min(len(rows) for rows in runs)
  rounds = [r["round"] for r in runs[0][:length]]
  values = np.array([[value(r) for r in rows[:length]] for rows in runs])
  ax.plot(rounds, np.median(values, axis=0), label=label, **style)
  if len(runs) > 1:
    ax.fill_between(rounds, values.min(axis=0), values.max(axis=0),
                    color=style["color"], alpha=0.15, lw=0)


def _repeated(results: dict) -> dict:
  """(a seed's cell, problem) -> each seed's metrics rows, for cells run at >1 seed."""
  return {key: runs for key, runs in _by_seeds(results).items() if len(runs) > 1}


def seed_bands(values) -> tuple:
  """Mean and sample standard deviation (ddof 1) over seeds, per evaluation point.

  values: [seeds, points]. The paper's Figures 1-2 draw mean +- k std, k in {0, 1, 2}.
  """
  import numpy as np
  values = np.asarray(values, dtype=np.float64)
  return values.mean(axis=0), values.std(axis=0, ddof=1)


def _plot_repetitions(repeated: dict, optima: dict, stem: str) -> None:
  """The paper's view of repeated runs: raw F (linear axis, F* dashed; the y range
  leaves out the first 5 % of the run, where every method starts from F(0)) and the
  estimation error (or test accuracy), mean with +-1 and +-2 std bands over the
  optimizers' seeds. Writes <stem>.png and <stem>.json (every plotted number)."""
  import numpy as np
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  problems = sorted({(k[0].objective, k[0].sigma or 0, k[0].classes or 0, k[0].title)
                     for k in repeated})
  labels = sorted({k[0].label for k in repeated})
  colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
  fig, axes = plt.subplots(2, len(problems), figsize=(max(3.8 * len(problems), 6.0), 6.4),
                           squeeze=False)
  record, top = [], {}
  for (cell, problem), runs in repeated.items():
    column = [p[:3] for p in problems].index(
        (cell.objective, cell.sigma or 0, cell.classes or 0))
    length = min(len(rows) for rows in runs)
    rounds = [rows["round"] for rows in runs[0][:length]]
    second = "estimation_error" if cell.sigma is not None else "test_accuracy"
    entry = dict(problem=problem, optimizer=cell.label, seeds=len(runs), rounds=rounds)
    for row, key in ((0, "objective"), (1, second)):
      mean, std = seed_bands([[r[key] for r in rows[:length]] for rows in runs])
      entry[key] = dict(mean=mean.tolist(), std=std.tolist())
      ax = axes[row][column]
      color = colors[cell.label]
      ax.plot(rounds, mean, color=color, lw=1.2,
              label=f"{cell.label} (mean of {len(runs)} seeds)")
      if row == 0:
        settled = len(rounds) // 20
        top[column] = max(top.get(column, optima[problem]),
                          float(np.max(mean[settled:] + 2 * std[settled:])))
      for k, alpha in ((1, 0.25), (2, 0.12)):
        ax.fill_between(rounds, mean - k * std, mean + k * std, color=color,
                        alpha=alpha, lw=0)
    record.append(entry)
  for (cell, problem) in repeated:
    column = [p[:3] for p in problems].index(
        (cell.objective, cell.sigma or 0, cell.classes or 0))
    optimum = optima[problem]
    axes[0][column].axhline(optimum, color="k", ls="--", lw=0.8)
    axes[0][column].set_ylim(optimum - 0.1 * (top[column] - optimum),
                             top[column] + 0.1 * (top[column] - optimum))
  for column, (_, _, _, title) in enumerate(problems):
    axes[0][column].set_title(title + " (F* dashed)", fontsize=10)
    axes[0][column].legend(fontsize=6)
    axes[1][column].set_xlabel("communications")
    for row in (0, 1):
      axes[row][column].grid(True, alpha=0.3)
  synthetic_plot = any(k[0].sigma is not None for k in repeated)
  axes[0][0].set_ylabel("training loss F (mean, +-1 and +-2 std)")
  axes[1][0].set_ylabel("estimation error" if synthetic_plot else "test accuracy")
  name = next(iter(repeated))[0].name
  fig.suptitle(f"{name}: repetitions over the optimizers' seeds, data fixed\n"
               "(binaries/reproduce_unified.py --repetitions)", fontsize=9)
  fig.tight_layout()
  fig.savefig(stem + ".png", dpi=110)
  plt.close(fig)
  with open(stem + ".json", "w") as f:
    json.dump(record, f)


def _plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  problems = sorted({(c.objective, c.sigma or 0, c.classes or 0, c.title)
                     for c in results})
  fig, axes = plt.subplots(2, len(problems), figsize=(3.4 * len(problems), 6.4),
                           squeeze=False)
  labels = sorted({c.label for c in results})
  colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
  for column, (objective, sigma, classes, title) in enumerate(problems):
    top, bottom = axes[0][column], axes[1][column]
    for (cell, _), runs in _by_seeds(results).items():
      if (cell.objective, cell.sigma or 0, cell.classes or 0) != (objective, sigma, classes):
        continue
      label = cell.label + (f" (median of {len(runs)} seeds)" if len(runs) > 1 else "")
      style = dict(color=colors[cell.label], lw=1.2,
                   ls="--" if not cell.reparametrize else "-")
      top.set_yscale("log")
      _draw(top, runs, lambda r: max(r["relative_suboptimality"], 1e-16), label, style)
      if cell.sigma is not None:
        bottom.set_yscale("log")
        _draw(bottom, runs, lambda r: r["estimation_error"], label, style)
      else:
        _draw(bottom, runs, lambda r: 100 * r["test_accuracy"], label, style)
    top.set_title(title, fontsize=10)
    bottom.set_xlabel("communications")
    for ax in (top, bottom):
      ax.grid(True, which="major", alpha=0.3)
  synthetic_plot = any(c.sigma is not None for c in results)
  axes[0][0].set_ylabel("(F - F*) / F*")
  axes[1][0].set_ylabel("estimation error" if synthetic_plot
                        else "test accuracy of local models (%)")
  for column in range(len(problems)):  # panels can hold different runs
    axes[0][column].legend(fontsize=6)
  dataset = next(iter(results)).name
  fig.suptitle(f"Unified PFL optimizers on {dataset} (binaries/reproduce_unified.py)",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _alpha_table(results: dict, path: str) -> None:
  """MT2 at each relaxation alpha (spec 4.6): the optimizer's run beside what the
  objective's own minimizer scores (central solver; so the test accuracy of alpha is
  told apart from how far 1000 communications got)."""
  from tff_pflego.unified import experiment
  lines = ["# MT2's relaxation alpha (spec 4.6)", "",
           "Made by `binaries/reproduce_unified.py --mt_alpha=...`. Each alpha is its own "
           "objective (own F*, constants and theory p_w); 'at F*': the local models "
           "beta*_m of the central optimum, scored on the devices' test data.", "",
           "| problem | optimizer | alpha | p_w | F* | test accuracy at F* | "
           "final (F-F*)/F* | final test accuracy |", "|---|---|---|---|---|---|---|---|"]
  runs = [(c, r) for c, r in _sorted(results) if c.objective == "mt2" and c.variant in (
      "", f"alpha={c.mt_alpha:g}" if c.mt_alpha is not None else "")]
  alphas_of = {}
  for cell, _ in runs:
    alphas_of.setdefault((cell.problem, cell.algorithm), set()).add(cell.mt_alpha)
  for cell, (summary, _) in sorted(runs, key=lambda cr: (cr[0].problem, cr[0].algorithm,
                                                          cr[0].mt_alpha or 1.0)):
    if len(alphas_of[(cell.problem, cell.algorithm)]) < 2:
      continue  # no alpha ablation of this run
    problem = experiment.build_problem(cell.config())
    optimum = problem.optimum
    at_optimum = problem.extras.test_accuracy(optimum.w, optimum.betas)
    final = summary["final"]
    lines.append(
        f"| {cell.name} {cell.title} | {cell.algorithm} | {cell.mt_alpha or 1.0:g} | "
        f"{summary['step_parameters']['p_w']:.3f} | {optimum.value:.6g} | "
        f"{100 * at_optimum:.2f} % | {final['relative_suboptimality']:.2e} | "
        f"{100 * final['test_accuracy']:.2f} % |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def _repetitions_table(results: dict) -> list[str]:
  """Cells run at several seeds: median [min, max] over the seeds."""
  import numpy as np
  groups = {}
  for cell, (summary, _) in _sorted(results):
    groups.setdefault((dataclasses.replace(cell, seed=0), cell.problem), []).append(
        summary)
  repeated = {k: v for k, v in groups.items() if len(v) > 1}
  if not repeated:
    return []
  lines = ["", "Repetitions (`--repetitions`: the optimizers' seeds; the data stay): "
           "median [min, max] over the seeds; final F as mean +- sample std.", "",
           "| problem | optimizer | seeds | comms to 1e-2 | final (F-F*)/F* | final F |",
           "|---|---|---|---|---|---|"]
  for (cell, _), summaries in repeated.items():
    finals = [s["final"]["relative_suboptimality"] for s in summaries]
    reach = [s["communications_to_reach"]["0.01"] for s in summaries]
    reached = [r for r in reach if r is not None]
    reach_text = (f"{np.median(reached):.0f} [{min(reached)}, {max(reached)}]"
                  + (f", {len(reach) - len(reached)} never" if len(reached) < len(reach)
                     else "") if reached else "-")
    mean, std = seed_bands([[s["final"]["objective"]] for s in summaries])
    lines.append(f"| {cell.name} {cell.title} | {cell.label} | {len(summaries)} | "
                 f"{reach_text} | {np.median(finals):.2e} [{min(finals):.2e}, "
                 f"{max(finals):.2e}] | {mean[0]:.6f} +- {std[0]:.1e} |")
  return lines


def claims_rows(results: dict) -> list[dict]:
  """Spec 4.7's real-data claims per problem, from the theory-setting seed-0 runs of
  LSGD, ASCD and ASVRCD after the same number of communications T:
  - ascd_speedup: T over the communications ASCD needs to reach LSGD's final relative
    suboptimality (how many times fewer communications; > 1 means ASCD is ahead);
  - lsgd_over_ascd: LSGD's final relative suboptimality over ASCD's;
  - asvrcd_over_ascd: ASVRCD's final over ASCD's (< 1: ASVRCD ahead at the end)."""
  from tff_pflego.unified import driver
  by_problem = {}
  for cell, (summary, rows) in _sorted(results):
    if cell.sigma is None and not cell.variant and not cell.seed:
      by_problem.setdefault(cell.problem, {})[cell.algorithm] = (cell, summary, rows)
  claims = []
  for problem, runs in by_problem.items():
    if not {"lsgd_pfl", "ascd_pfl", "asvrcd_pfl"} <= set(runs):
      continue
    final = {a: runs[a][1]["final"]["relative_suboptimality"] for a in runs}
    lsgd_rows, ascd_rows = runs["lsgd_pfl"][2], runs["ascd_pfl"][2]
    reach = driver.rounds_to_reach(ascd_rows, final["lsgd_pfl"])
    claims.append(dict(
        problem=problem, title=f"{runs['ascd_pfl'][0].name} {runs['ascd_pfl'][0].title}",
        communications=int(lsgd_rows[-1]["round"]),
        ascd_reaches_lsgd_final=None if reach is None else int(reach),
        ascd_speedup=(lsgd_rows[-1]["round"] / reach) if reach else None,
        lsgd_over_ascd=final["lsgd_pfl"] / final["ascd_pfl"],
        asvrcd_over_ascd=final["asvrcd_pfl"] / final["ascd_pfl"]))
  return claims


def _claims_table(results: dict) -> list[str]:
  claims = claims_rows(results)
  if not claims:
    return []
  ahead = sum(c["lsgd_over_ascd"] > 1 for c in claims)
  variance_reduced = sum(c["asvrcd_over_ascd"] < 1 for c in claims)
  lines = ["", "Real data, the paper's claims per problem (seed 0, the theory's settings): "
           "the communications ASCD needs to reach LSGD's final relative suboptimality "
           "(speedup = LSGD's communications / ASCD's), LSGD's final over ASCD's, and "
           "ASVRCD's final over ASCD's (< 1: ASVRCD ahead at the end). "
           f"ASCD ahead of LSGD in {ahead} of {len(claims)} problems; ASVRCD ahead of "
           f"ASCD at the end in {variance_reduced} of {len(claims)}.", "",
           "| problem | ASCD reaches LSGD's final at | speedup in communications | "
           "LSGD / ASCD final | ASVRCD / ASCD final |", "|---|---|---|---|---|"]
  for c in claims:
    reach = ("never" if c["ascd_reaches_lsgd_final"] is None
             else f"{c['ascd_reaches_lsgd_final']} of {c['communications']}")
    speedup = "-" if c["ascd_speedup"] is None else f"{c['ascd_speedup']:.1f}x"
    lines.append(f"| {c['title']} | {reach} | {speedup} | {c['lsgd_over_ascd']:.1f} | "
                 f"{c['asvrcd_over_ascd']:.2f} |")
  return lines


def _table(results: dict, path: str) -> None:
  lines = ["# Unified framework: measured results", "",
           "Made by `binaries/reproduce_unified.py` (one run per row, seed 0, 1000 "
           "communications unless said); F* from the central float64 solver; last "
           "column: the run's loop on 2 CPU cores, evaluations included, other jobs "
           "possibly running (a timing, not a benchmark).", "",
           "| problem | optimizer | comms to 1e-2 | 1e-4 | 1e-6 | final (F-F*)/F* "
           "| final estimation error / test accuracy | s / 1000 comms |",
           "|---|---|---|---|---|---|---|---|"]
  for cell, (summary, _) in _sorted(results):
    if cell.seed:
      continue  # repetitions: the table below
    reach = summary["communications_to_reach"]
    cells = [str(reach[p]) if reach[p] is not None else "-"
             for p in ("0.01", "0.0001", "1e-06")]
    seconds = summary["seconds"] * 1000 / summary["communications"]
    final = summary["final"]
    score = (f"{final['estimation_error']:.4g}" if cell.sigma is not None
             else f"{100 * final['test_accuracy']:.2f} %")
    lines.append(f"| {cell.name} {cell.title} | {cell.label} | {' | '.join(cells)} "
                 f"| {final['relative_suboptimality']:.2e} | {score} | {seconds:.0f} |")
  lines += _repetitions_table(results)
  lines += _claims_table(results)
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  cli.run_main(main)
