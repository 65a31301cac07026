r"""Draws several runs' objective and accuracy side by side, under every protocol.

  python binaries/compare_runs.py --runs=runs/a,runs/b --labels="Adam .001,Adam .0003" \
      --output=docs/cifar10_lpsi

Left: L(psi) with each client's own head (solid) and after every client refits its head
on the current body (`--refit_eval`, dashed), log scale. Right: test accuracy, all
clients (solid), after the refit (dashed), sampled clients right after their update
(dotted; the mean of the last 10 rounds). Writes <output>.png and <output>.json (the
plotted numbers, per run).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import json
import os

from absl import flags
import numpy as np

from tff_pflego.errors import UserError
from tff_pflego.training import run_files

_RUNS = flags.DEFINE_list("runs", None, "Run directories (--output_dir), or their "
                          "records (docs/runs/..., docs/ablations/...).", required=True)
_LABELS = flags.DEFINE_list("labels", None, "A label per run (default: the directory).")
_OUTPUT = flags.DEFINE_string("output", "runs/compare", "Output path without extension.")
_TITLE = flags.DEFINE_string("title", "", "Figure title.")

WINDOW = 10  # rounds averaged for the sampled protocol's curve

# A line style per protocol, shared by the curves and the legend's keys.
PROTOCOL_STYLES = dict(own=dict(lw=2, marker="o", ms=4),
                       refit=dict(lw=1.4, ls="--", marker="s", ms=3),
                       sampled=dict(lw=1.2, ls=":"))
PROTOCOL_LEGEND = dict(
    own="solid: each client's own head (L(ψ); accuracy over all clients)",
    refit="dashed: after every client refits its head",
    sampled=f"dotted: sampled clients (accuracy, mean of the last {WINDOW} rounds)")


def _run_files(run_dir: str) -> dict[str, str]:
  """A run's (or its record's) metrics.csv and rounds.csv; raises UserError if missing."""
  paths = {name: os.path.join(run_dir, name)
           for name in (run_files.METRICS_FILE, run_files.ROUNDS_FILE)}
  for path in paths.values():
    if not (os.path.exists(path) or os.path.exists(path + ".gz")):  # a run, or its record
      raise UserError(f"--runs: {run_dir} holds no run ({path} is missing)")
  return paths


def run_curves(run_dir: str) -> dict[str, list[float]]:
  """The plotted columns of one run (NaN where a protocol was not evaluated)."""
  from tff_pflego.records import read_rows
  paths = _run_files(run_dir)
  evals = read_rows(paths[run_files.METRICS_FILE])
  rounds = read_rows(paths[run_files.ROUNDS_FILE])
  column = lambda rows, name: [float(r.get(name, np.nan)) for r in rows]
  sampled = np.array(column(rounds, "test_accuracy_sampled_pooled"))
  trailing = [float(np.nanmean(sampled[max(0, k - WINDOW + 1):k + 1]))
              if np.isfinite(sampled[max(0, k - WINDOW + 1):k + 1]).any() else np.nan
              for k in range(len(sampled))]
  return dict(eval_round=column(evals, "round"), train_loss=column(evals, "train_loss"),
              train_loss_refit=column(evals, "train_loss_refit"),
              test_accuracy_mean=column(evals, "test_accuracy_mean"),
              test_accuracy_refit_mean=column(evals, "test_accuracy_refit_mean"),
              round=column(rounds, "round"), sampled_pooled_last10=trailing)


def check(argv: list[str]) -> list[str]:
  """Before anything loads: a label per run, and runs that exist; returns the labels."""
  labels = _LABELS.value or _RUNS.value
  if len(labels) != len(_RUNS.value):
    raise UserError(f"--labels gives {len(labels)} labels for {len(_RUNS.value)} runs")
  for run_dir in _RUNS.value:
    _run_files(run_dir)
  return labels


def main(argv: list[str]) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D

  labels = check(argv)
  curves = {label: run_curves(run) for label, run in zip(labels, _RUNS.value)}
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(13, 5.4), layout="constrained")
  run_keys = []
  for k, (label, c) in enumerate(curves.items()):
    color = f"C{k}"
    run_keys.append(Line2D([], [], color=color, lw=3, label=label))
    ax_loss.plot(c["eval_round"], c["train_loss"], color=color, **PROTOCOL_STYLES["own"])
    ax_loss.plot(c["eval_round"], c["train_loss_refit"], color=color,
                 **PROTOCOL_STYLES["refit"])
    ax_acc.plot(c["eval_round"], 100 * np.array(c["test_accuracy_mean"]), color=color,
                **PROTOCOL_STYLES["own"])
    ax_acc.plot(c["eval_round"], 100 * np.array(c["test_accuracy_refit_mean"]),
                color=color, **PROTOCOL_STYLES["refit"])
    ax_acc.plot(c["round"], 100 * np.array(c["sampled_pooled_last10"]), color=color,
                **PROTOCOL_STYLES["sampled"])
  # One legend for both panels, below them: a colour per run, a line style per protocol
  # (a legend per panel with every run x protocol covered the curves from 3 runs on).
  style_keys = [Line2D([], [], color="0.3", **PROTOCOL_STYLES[name], label=text)
                for name, text in PROTOCOL_LEGEND.items()]
  rows = max(len(run_keys), len(style_keys))  # column 1 the runs, column 2 the styles
  blank = lambda: Line2D([], [], alpha=0, label=" ")
  fig.legend(handles=[*run_keys, *(blank() for _ in range(rows - len(run_keys))),
                      *style_keys, *(blank() for _ in range(rows - len(style_keys)))],
             loc="outside lower center", ncol=2, fontsize=8, frameon=False)
  ax_loss.set(yscale="log", xlabel="round", ylabel="train loss L(ψ) (log scale)",
              title="The objective, all clients")
  ax_acc.set(xlabel="round", ylabel="test accuracy (%)", title="Test accuracy")
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
  if _TITLE.value:
    fig.suptitle(_TITLE.value)
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  fig.savefig(_OUTPUT.value + ".png", dpi=110)
  plt.close(fig)
  with open(_OUTPUT.value + ".json", "w") as f:
    json.dump(dict(runs=dict(zip(labels, _RUNS.value)), curves=curves), f, indent=1)
  print(f"wrote {_OUTPUT.value}.png and .json")


if __name__ == "__main__":
  cli.run_main(main, check=check, tensorflow=False)
