r"""The unified framework's synthetic experiments (spec UNIFIED.md 4.1, 4.2): every
optimizer on synthetic MX2 (sigma 0.1, 0.3, 1) and EWS (sigma 5, 10, 15), 1000
communications each, suboptimality against the central F*.

  python binaries/reproduce_unified.py --output_dir=runs/unified --docs_dir=docs/unified

Resumable: a run whose summary.json exists is read, not rerun. Writes
<docs_dir>/synthetic.png (relative suboptimality and estimation error against
communications, one column per problem) and <docs_dir>/results.md (communications to
reach 1e-2 / 1e-4 / 1e-6, final suboptimality, seconds per 1000 communications).
"""

from __future__ import annotations

from tff_pflego import cli  # pylint: disable=g-bad-import-order

import csv
import json
import os

from absl import flags

from tff_pflego.errors import UserError
from tff_pflego.unified import experiment, registry, synthetic

flags.DEFINE_string("output_dir", "runs/unified", "Where each run's outputs go.")
flags.DEFINE_string("docs_dir", "docs/unified", "Where the figure and table go.")
flags.DEFINE_list("datasets", list(synthetic.SYNTHETIC), "Problems to run.")
flags.DEFINE_list("heterogeneity", [], "sigma values (default: the paper's for each).")
flags.DEFINE_list("algorithms", list(registry.OPTIMIZERS), "Optimizers to run.")
flags.DEFINE_integer("rounds", 1000, "Communications per run.", lower_bound=1)
flags.DEFINE_integer("eval_every", 5, "Communications between evaluations.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "The optimizers' seed.")


def _cells():
  f = flags.FLAGS
  for dataset in f.datasets:
    if dataset not in synthetic.SYNTHETIC:
      raise UserError(f"--datasets: unknown problem {dataset!r}")
    sigmas = ([float(s) for s in f.heterogeneity] if f.heterogeneity
              else synthetic.PAPER_HETEROGENEITY[dataset])
    for sigma in sigmas:
      for algorithm in f.algorithms:
        if algorithm not in registry.OPTIMIZERS:
          raise UserError(f"--algorithms: unknown optimizer {algorithm!r}")
        if registry.supports(algorithm, dataset.split("_", 1)[-1]):
          yield dataset, sigma, algorithm


def _run_dir(dataset: str, sigma: float, algorithm: str) -> str:
  return os.path.join(flags.FLAGS.output_dir, f"{dataset}_sigma{sigma:g}", algorithm)


def _read_rows(run_dir: str) -> list[dict]:
  with open(os.path.join(run_dir, "metrics.csv")) as f:
    return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def main(argv: list[str]) -> None:
  del argv
  from tff_pflego import runtime
  f = flags.FLAGS
  cells = list(_cells())
  results = {}
  with runtime.execution_context():
    for dataset, sigma, algorithm in cells:
      run_dir = _run_dir(dataset, sigma, algorithm)
      summary_path = os.path.join(run_dir, "summary.json")
      if not os.path.exists(summary_path):
        print(f"{dataset} sigma={sigma:g} {algorithm}: {f.rounds} communications")
        experiment.run(experiment.UnifiedConfig(
            dataset=dataset, heterogeneity=sigma, algorithm=algorithm, rounds=f.rounds,
            seed=f.seed, eval_every=f.eval_every, output_dir=run_dir, progress=True))
      with open(summary_path) as s:
        results[(dataset, sigma, algorithm)] = (json.load(s), _read_rows(run_dir))
  os.makedirs(f.docs_dir, exist_ok=True)
  _plot(results, os.path.join(f.docs_dir, "synthetic.png"))
  _table(results, os.path.join(f.docs_dir, "results.md"))
  print(f"wrote {f.docs_dir}/synthetic.png and {f.docs_dir}/results.md")


def _plot(results: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  problems = sorted({(d, s) for d, s, _ in results})
  fig, axes = plt.subplots(2, len(problems), figsize=(3.6 * len(problems), 6.4),
                           squeeze=False)
  for column, (dataset, sigma) in enumerate(problems):
    top, bottom = axes[0][column], axes[1][column]
    for (d, s, algorithm), (_, rows) in sorted(results.items()):
      if (d, s) != (dataset, sigma):
        continue
      rounds = [r["round"] for r in rows]
      top.semilogy(rounds, [max(r["relative_suboptimality"], 1e-16) for r in rows],
                   label=algorithm)
      bottom.semilogy(rounds, [r["estimation_error"] for r in rows], label=algorithm)
    top.set_title(f"{dataset.replace('synthetic_', '').upper()}, sigma = {sigma:g}")
    top.set_ylabel("(F - F*) / F*")
    bottom.set_ylabel("estimation error")
    bottom.set_xlabel("communications")
    for ax in (top, bottom):
      ax.grid(True, which="major", alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.suptitle("Unified PFL optimizers, synthetic problems\n"
               "(binaries/reproduce_unified.py)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _table(results: dict, path: str) -> None:
  lines = ["# Unified framework: synthetic problems", "",
           "Made by `binaries/reproduce_unified.py`; F* from the central float64 solver; "
           "seconds: the run's loop on 2 CPU cores (evaluation included).", "",
           "| problem | sigma | optimizer | comms to 1e-2 | 1e-4 | 1e-6 | final (F-F*)/F* "
           "| final estimation error | s / 1000 comms |",
           "|---|---|---|---|---|---|---|---|---|"]
  for (dataset, sigma, algorithm), (summary, _) in sorted(results.items()):
    reach = summary["communications_to_reach"]
    cells = [str(reach[p]) if reach[p] is not None else "-" for p in ("0.01", "0.0001", "1e-06")]
    seconds = summary["seconds"] * 1000 / summary["communications"]
    lines.append(f"| {dataset} | {sigma:g} | {algorithm} | {' | '.join(cells)} | "
                 f"{summary['final']['relative_suboptimality']:.2e} | "
                 f"{summary['final']['estimation_error']:.4g} | {seconds:.0f} |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  cli.run_main(main)
