r"""Runs a grid of experiments (datasets x degrees x algorithms x seeds) and tabulates it.

  python binaries/reproduce.py --datasets=fashion_mnist --degrees=high,medium,none \
      --algorithms=pflego,fedavg,fedper --seeds=0 --output_dir=runs/reproduce

Each cell is `train.py` with the paper's settings (the same `run_experiment`), in
`<output_dir>/<dataset>/<degree>/<algorithm>/seed<k>/`. The grid is resumable: a cell
with a summary.json is skipped, and a cell cut short resumes from its checkpoint.
Writes, after every cell:
  results.csv   one row per cell: the mean and std of the last 10 evaluations
  results.md    per dataset, one table per evaluation protocol (all clients; sampled
                clients right after their update): mean +- std over the last 10
                evaluations (and across seeds) beside the paper's value, and a line
                for every cell more than 1.5 points from the paper's
  <dataset>_curves.png  train loss and test accuracy per round, one panel per degree,
                one line per algorithm
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import os
import csv
import json

from absl import flags
import numpy as np


_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/reproduce", "Where the grid goes.")
_DATASETS = flags.DEFINE_list("datasets", ["fashion_mnist"], "Datasets.")
_DEGREES = flags.DEFINE_list("degrees", ["high", "medium", "none"], "Personalization.")
_ALGORITHMS = flags.DEFINE_list(
    "algorithms", ["pflego", "fedavg", "fedper", "fedprox", "fedrep", "fedbabu"],
    "Algorithms.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds.")
_ROUNDS = flags.DEFINE_integer("rounds", None, "T (default: the paper's).")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", None, "I (default: the paper's).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 10, "All-client evaluation period.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
_PROGRESS = flags.DEFINE_bool("progress", True, "A progress bar per run.")
_TABLES_ONLY = flags.DEFINE_bool("tables_only", False,
                                 "Run nothing: tabulate the finished cells only.")

WINDOW = 10
METRIC = "test_accuracy_mean"
SAMPLED_METRIC = "test_accuracy_sampled_pooled"
REFIT_METRIC = "test_accuracy_refit_mean"
TARGET = 0.95  # for the time-to-accuracy columns
MARGIN = 0.015  # a cell more than 1.5 points off the paper's value gets a note
# Why a cell lies far from the paper's value, where we know.
NOTES = {
    ("fedavg", "all"): "FedAvg's one shared head cannot serve clients whose local label "
                       "0 means different classes (labels are re-indexed per client); the "
                       "paper's figure matches the sampled protocol, where each client is "
                       "scored right after its tau local steps (local adaptation).",
    ("fedprox", "all"): "as FedAvg: one shared head for per-client label spaces.",
    ("fedbabu", "all"): "as FedAvg: the fixed orthogonal head is one head for all "
                        "clients, and per-client label indices conflict across clients.",
    ("fedbabu", "sampled"): "each client adapts only the body, for --body_steps=5 steps "
                            "(spec); the reference code runs all tau = 50 local steps on "
                            "the body: `train.py --algorithm=fedbabu --body_steps=50` "
                            "gives 96.28 sampled (seed 0, measured), 0.6 above the paper.",
    ("fedrep", "all"): "at the spec's beta = .003 FedRep's plain-GD head and body steps "
                       "move slowly; measured (seed 0, `train.py --algorithm=fedrep`): "
                       "--client_lr=0.007 (every other baseline's rate) gives 95.00 all / "
                       "95.66 sampled, while the head/body split does not matter "
                       "(--body_steps=25: 93.71 / 94.46; default 45 + 5).",
    ("ditto", "sampled"): "Ditto's personal models are trained only on rounds that "
                          "sample the client; scored right after such a round.",
}
FIELDS = ["dataset", "degree", "algorithm", "seed", "rounds", "accuracy_mean",
          "accuracy_std", "sampled_pooled_mean", "sampled_pooled_std", "refit_mean",
          "refit_std", "train_loss_mean",
          "time_per_round_s",
          "client_time_per_round_s", "train_s_to_95_all", "train_s_to_95_sampled",
          "body_forward", "body_backward", "paper_accuracy",
          "run_dir"]


def cell_dir(dataset: str, degree: str, algorithm: str, seed: int) -> str:
  return os.path.join(_OUTPUT_DIR.value, dataset, degree, algorithm, f"seed{seed}")


def run_cell(dataset: str, degree: str, algorithm: str, seed: int) -> None:
  from tff_pflego.experiment import ExperimentConfig, has_checkpoint, run_experiment
  directory = cell_dir(dataset, degree, algorithm, seed)
  config = ExperimentConfig(
      dataset=dataset, algorithm=algorithm, personalization=degree, seed=seed,
      rounds=_ROUNDS.value, num_clients=_NUM_CLIENTS.value, eval_every=_EVAL_EVERY.value,
      output_dir=directory, progress=_PROGRESS.value,
      overwrite=not has_checkpoint(directory))  # resume a cut cell, else start afresh
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  run_experiment(config)


def _rows(path: str) -> list[dict]:
  from tff_pflego.training.release import read_rows
  return read_rows(path)


def cell_result(dataset: str, degree: str, algorithm: str, seed: int) -> dict:
  from tff_pflego.config import PAPER_ACCURACY
  directory = cell_dir(dataset, degree, algorithm, seed)
  with open(os.path.join(directory, "summary.json")) as f:
    summary = json.load(f)
  evals = [r for r in _rows(os.path.join(directory, "metrics.csv")) if r["round"] > 0]
  last = np.array([r[METRIC] for r in evals[-WINDOW:]])
  refit = np.array([r.get(REFIT_METRIC, np.nan) for r in evals[-WINDOW:]])
  rounds = _rows(os.path.join(directory, "rounds.csv"))
  sampled = np.array([r[SAMPLED_METRIC] for r in rounds[-WINDOW:]])
  passes = summary.get("body_passes_per_client_round", {})
  return dict(dataset=dataset, degree=degree, algorithm=algorithm, seed=seed,
              rounds=summary["rounds"], accuracy_mean=float(last.mean()),
              accuracy_std=float(last.std()),
              sampled_pooled_mean=float(np.nanmean(sampled)),
              sampled_pooled_std=float(np.nanstd(sampled)),
              refit_mean=float(refit.mean()), refit_std=float(refit.std()),
              train_loss_mean=summary["final"]["train_loss"],
              time_per_round_s=summary["time_per_round_s"],
              client_time_per_round_s=summary.get("client_time_per_round_s"),
              **time_to_accuracy(rounds, evals, TARGET),
              body_forward=passes.get("forward"), body_backward=passes.get("backward"),
              paper_accuracy=PAPER_ACCURACY.get((dataset, algorithm, degree)),
              run_dir=directory)


def _table(results: list[dict], dataset: str, key: str) -> list[str]:
  """One markdown table: algorithms x degrees, `key` mean +- std [paper]."""
  lines = ["| algorithm | " + " | ".join(_DEGREES.value) + " |",
           "|---" * (len(_DEGREES.value) + 1) + "|"]
  for algorithm in _ALGORITHMS.value:
    cells = []
    for degree in _DEGREES.value:
      mine = [r for r in results if (r["dataset"], r["degree"], r["algorithm"]) ==
              (dataset, degree, algorithm) and r[f"{key}_mean"] == r[f"{key}_mean"]]
      if not mine:
        cells.append("—")
        continue
      means = np.array([r[f"{key}_mean"] for r in mine])
      std = np.std(means) if len(mine) > 1 else mine[0][f"{key}_std"]
      paper = mine[0]["paper_accuracy"]
      cell = f"{100 * means.mean():.2f} ± {100 * std:.2f}"
      if paper is not None:
        cell += f" [{100 * paper:.2f}]"
      cells.append(cell + (f" (n={len(mine)})" if len(mine) > 1 else ""))
    lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
  return lines + [""]


def _notes(results: list[dict]) -> list[str]:
  """A line for every cell more than MARGIN away from the paper's value."""
  lines = []
  for r in results:
    if r["paper_accuracy"] is None:
      continue
    for protocol, key in (("all", "accuracy_mean"), ("sampled", "sampled_pooled_mean")):
      gap = r[key] - r["paper_accuracy"]
      if abs(gap) > MARGIN:
        why = NOTES.get((r["algorithm"], protocol), "no explanation known yet")
        lines.append(f"- {r['dataset']}/{r['degree']}/{r['algorithm']} ({protocol} "
                     f"clients): {100 * r[key]:.2f} vs the paper's "
                     f"{100 * r['paper_accuracy']:.2f} ({100 * gap:+.2f} points): {why}")
  return lines


def time_to_accuracy(rounds: list[dict], evals: list[dict], target: float) -> dict:
  """Training seconds (the rounds' wall time, evaluations excluded) until accuracy
  first reaches `target`: all clients (evaluated rounds), and sampled clients (the
  mean of the last 10 rounds' values, which are noisy one by one); NaN if never."""
  elapsed = dict(zip([int(r["round"]) for r in rounds],
                     np.cumsum([r["round_time_s"] for r in rounds])))
  first_all = next((int(r["round"]) for r in evals if r[METRIC] >= target), None)
  sampled = np.array([r[SAMPLED_METRIC] for r in rounds])
  trailing = [np.nanmean(sampled[max(0, k - WINDOW + 1):k + 1]) for k in range(len(rounds))]
  first_sampled = next((int(rounds[k]["round"]) for k, v in enumerate(trailing)
                        if k >= WINDOW - 1 and v >= target), None)
  seconds = lambda r: float("nan") if r is None else float(elapsed[r])
  return dict(train_s_to_95_all=seconds(first_all),
              train_s_to_95_sampled=seconds(first_sampled))


def write_tables(results: list[dict]) -> None:
  with open(os.path.join(_OUTPUT_DIR.value, "results.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(results)
  lines = ["# Reproduction results", "",
           f"Test accuracy (%), mean ± std over the last {WINDOW} rounds (across seeds "
           "when there are several); the paper's value (spec section 6) in brackets; "
           "— = not run yet. Two protocols (spec section 5):", "",
           "- **all clients**: every client, the current body and its own head (the "
           "paper's text), evaluated every `eval_every` rounds and each of the last 10;",
           "- **sampled clients**: each round's clients right after their local update, "
           "pooled over their test examples (the reference code, whose numbers the paper "
           "reports);",
           "- **after a head refit**: every client, the current body and its head "
           "refitted first with tau - 1 head-only steps (what a deployed client would "
           "see; `--refit_eval`; cells run before it existed show —).", ""]
  for dataset in _DATASETS.value:
    note = [f"*{DATASET_NOTES[dataset]}*", ""] if dataset in DATASET_NOTES else []
    lines += [f"## {dataset}: all clients", ""] + note + _table(results, dataset,
                                                                 "accuracy")
    lines += [f"## {dataset}: sampled clients", ""] + note + _table(results, dataset,
                                                                   "sampled_pooled")
    lines += [f"## {dataset}: all clients after a head refit", ""] + note + _table(
        results, dataset, "refit")
  lines += ["## Cost per round and training time to 95% (seconds; `—`: never)", "",
            "| cell | s/round | client s/round | body fwd+bwd per client | to 95% all "
            "| to 95% sampled |", "|---|---|---|---|---|---|"]
  def fmt(value, spec=".0f"):
    return "—" if value is None or value != value else format(value, spec)
  for r in results:
    lines.append(f"| {r['dataset']}/{r['degree']}/{r['algorithm']} | "
                 f"{fmt(r['time_per_round_s'], '.2f')} | "
                 f"{fmt(r['client_time_per_round_s'], '.2f')} | "
                 f"{fmt(r['body_forward'])}+{fmt(r['body_backward'])} | "
                 f"{fmt(r['train_s_to_95_all'])} | {fmt(r['train_s_to_95_sampled'])} |")
  lines.append("")
  notes = _notes(results)
  if notes:
    lines += [f"## Cells more than {100 * MARGIN:.1f} points from the paper", ""] + notes
  with open(os.path.join(_OUTPUT_DIR.value, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


# Said under every table of a dataset whose data differ from the paper's.
DATASET_NOTES = {
    "emnist_letters": "EMNIST-Letters (26 classes, 124,800 train examples): the paper "
                      "used EMNIST ByClass (62 classes), which is not available here, so "
                      "no cell compares with a paper figure; Medium-Pers is K = 13.",
    "cifar10": "CIFAR-10 from the shared JPEG copy (re-encoded images, not the "
               "original pixel arrays).",
}


# One look per algorithm in every panel and figure; PFLEGO drawn thickest.
LINE_STYLES = {"pflego": ("C0", "-"), "fedavg": ("C1", "-"), "fedper": ("C2", "-"),
               "fedprox": ("C3", "--"), "fedrep": ("C4", "-"), "fedbabu": ("C5", "--"),
               "ditto": ("C6", "-"), "fedrecon": ("C7", "-.")}
DEGREE_TITLES = {"high": "High-Pers (K = 2)", "medium": "Medium-Pers (K = C/2)",
                 "none": "No-Pers (K = C)"}


def plot(dataset: str) -> None:
  """Train loss (top) and all-client test accuracy (bottom) per round, a column per
  degree, a line per algorithm, one legend for the figure."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  degrees = _DEGREES.value
  fig, axes = plt.subplots(2, len(degrees), figsize=(5 * len(degrees), 8),
                           layout="constrained", squeeze=False)
  handles = {}
  for column, degree in enumerate(degrees):
    for algorithm in _ALGORITHMS.value:
      directory = cell_dir(dataset, degree, algorithm, int(_SEEDS.value[0]))
      path = os.path.join(directory, "metrics.csv")
      if not os.path.exists(os.path.join(directory, "summary.json")):
        continue  # not run, or not finished
      rows = _rows(path)
      rounds = [r["round"] for r in rows]
      color, dashes = LINE_STYLES.get(algorithm, ("black", ":"))
      style = dict(lw=2.6 if algorithm == "pflego" else 1.4, color=color, ls=dashes,
                   zorder=3 if algorithm == "pflego" else 2)
      axes[0][column].plot(rounds, [r["train_loss"] for r in rows], **style)
      handles[algorithm], = axes[1][column].plot(
          rounds, [100 * r[METRIC] for r in rows], **style)
    axes[0][column].set(title=DEGREE_TITLES.get(degree, degree), yscale="log",
                        ylabel="train loss L(ψ) (log)")
    axes[1][column].set(xlabel="round", ylabel="test accuracy, all clients (%)")
    for ax in (axes[0][column], axes[1][column]):
      ax.grid(alpha=0.3)
  fig.legend(handles.values(), handles.keys(), loc="outside lower center",
             ncol=len(handles), frameon=False)
  fig.suptitle(f"{dataset}: train loss and test accuracy per round (seed "
               f"{_SEEDS.value[0]})")
  fig.savefig(os.path.join(_OUTPUT_DIR.value, f"{dataset}_curves.png"), dpi=110)
  plt.close(fig)


def main(argv) -> None:
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  cells = [(d, g, a, int(s)) for d in _DATASETS.value for g in _DEGREES.value
           for a in _ALGORITHMS.value for s in _SEEDS.value]
  results = []
  for number, cell in enumerate(cells, 1):
    done = os.path.exists(os.path.join(cell_dir(*cell), "summary.json"))
    print(f"[{number}/{len(cells)}] {'/'.join(map(str, cell))}: "
          f"{'done, skipped' if done else 'missing' if _TABLES_ONLY.value else 'running'}",
          flush=True)
    if not done:
      if _TABLES_ONLY.value:
        continue
      run_cell(*cell)
    results.append(cell_result(*cell))
    write_tables(results)
    plot(cell[0])
  print(open(os.path.join(_OUTPUT_DIR.value, "results.md")).read())


if __name__ == "__main__":
  cli.run_main(main)
