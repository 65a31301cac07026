"""The figure of a run, `curves.png`, drawn from the run's own files.

`plot_run(output_dir)` reads `summary.json`, `metrics.csv` and `rounds.csv` (so a
finished run can be redrawn: `binaries/plot.py`) and draws two panels:

* the training objective L(psi) over all clients at each evaluation, on a log axis
  labelled at 1-2-5 steps when it spans at least half a decade, on a linear axis
  otherwise;
* test accuracy: all clients' mean and worst 10 % at each evaluation, the sampled
  clients pooled at each round (the reference code's protocol), and the paper's value;
  each legend entry states its final value (the mean over the summary's window), and
  the axis shows every point.

Round ticks are integers; runs with few evaluations get markers; legends sit below
the panels, never over the curves.
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np

from tff_pflego.training.release import read_rows
from tff_pflego.training.run_files import CURVES_FILE, METRICS_FILE, ROUNDS_FILE, SUMMARY_FILE

if TYPE_CHECKING:  # matplotlib is imported only where a figure is drawn
  from matplotlib.figure import Figure
  from matplotlib.legend import Legend

_MARKERS_UP_TO = 30  # evaluations; beyond, markers would hide the line


def figure_legend(fig: Figure, handles: Sequence, labels: Sequence[str], most: int = 5
                  ) -> Legend:
  """One legend for the whole figure, below its panels, with as many entries side by
  side (at most `most`) as fit across the figure: measured on the figure's renderer,
  so a narrow figure's legend wraps onto more rows instead of running off its edges."""
  renderer = fig.canvas.get_renderer()
  for columns in range(min(len(labels), most), 0, -1):
    legend = fig.legend(handles, labels, loc="outside lower center", frameon=False,
                        ncol=columns)
    if columns == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width:
      return legend
    legend.remove()


def plot_run(output_dir: str) -> str:
  """Draws `<output_dir>/curves.png` from the run's files; returns its path."""
  with open(os.path.join(output_dir, SUMMARY_FILE)) as f:
    summary = json.load(f)
  history = read_rows(os.path.join(output_dir, METRICS_FILE))
  rounds = read_rows(os.path.join(output_dir, ROUNDS_FILE))
  path = os.path.join(output_dir, CURVES_FILE)
  plt = _pyplot()
  fig = figure(summary, history, rounds)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt
  return plt


def _finite(xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
  x, y = np.asarray(xs, float), np.asarray(ys, float)
  keep = np.isfinite(y)
  return x[keep], y[keep]


def _column(rows: list[dict], name: str) -> list[float]:
  return [r.get(name, math.nan) for r in rows]


def _percent(value: Optional[float]) -> str:
  return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:.2f} %"


def _title(summary: dict) -> str:
  algorithm = str(summary.get("algorithm", "")).upper()
  return (f"{algorithm} on {summary.get('dataset_display_name', '')}, "
          f"{summary.get('personalization', '')} personalization, "
          f"I = {summary.get('num_clients', '?')}, {summary.get('rounds', '?')} rounds")


def _log_axis_ticks(ax, low: float, high: float) -> None:
  """Labels a log axis at 1-2-5 steps (1-1.5-2-3-5-7 inside one decade)."""
  from matplotlib import ticker
  subs = (1.0, 2.0, 5.0) if high / low >= 10 else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
  ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
  ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def figure(summary: dict, history: list[dict], rounds: list[dict]):
  """The two panels as a matplotlib Figure (see the module docstring)."""
  plt = _pyplot()
  from matplotlib import ticker

  final = summary.get("final", {})
  eval_rounds = _column(history, "round")
  markers = "o" if len(history) <= _MARKERS_UP_TO else None
  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)

  x, loss = _finite(eval_rounds, _column(history, "train_loss"))
  ax_loss.plot(x, loss, color="tab:blue", lw=2, marker=markers, ms=4,
               label=f"all clients (final {final.get('train_loss', math.nan):.4g})")
  if len(loss) and loss.min() > 0 and loss.max() / loss.min() >= 10 ** 0.5:
    ax_loss.set_yscale("log")
    _log_axis_ticks(ax_loss, loss.min(), loss.max())
    ax_loss.set_ylabel("train loss L(ψ) (log scale)")
  else:
    ax_loss.set_ylabel("train loss L(ψ)")
  ax_loss.set(xlabel="round", title="Training objective")

  series = [
      ("all clients, mean", eval_rounds, _column(history, "test_accuracy_mean"),
       final.get("test_accuracy_mean"), dict(color="tab:blue", lw=2, marker=markers)),
      ("all clients, worst 10 %", eval_rounds, _column(history, "test_accuracy_worst10"),
       final.get("test_accuracy_worst10"),
       dict(color="tab:red", lw=1.6, marker=markers)),
      ("all clients after a head refit, mean", eval_rounds,
       _column(history, "test_accuracy_refit_mean"),
       final.get("test_accuracy_refit_mean"),
       dict(color="tab:purple", lw=1.4, ls="--", marker=markers)),
      ("sampled clients, pooled (reference code)", _column(rounds, "round"),
       _column(rounds, "test_accuracy_sampled_pooled"),
       final.get("test_accuracy_sampled_pooled"),
       dict(color="tab:green", lw=1, alpha=0.6,
            marker="." if len(rounds) <= _MARKERS_UP_TO else None)),
  ]
  lowest = 100.0
  for label, xs, ys, final_value, style in series:
    x, y = _finite(xs, ys)
    if len(y):
      ax_acc.plot(x, 100 * y, ms=4, label=f"{label}: {_percent(final_value)}", **style)
      lowest = min(lowest, 100 * y.min())
  reference = summary.get("paper_test_accuracy")
  if reference is not None:
    ax_acc.axhline(100 * reference, color="black", ls="--", lw=1,
                   label=f"paper (Table 1): {_percent(reference)}")
    lowest = min(lowest, 100 * reference)
  ax_acc.set_ylim(max(0.0, 5 * math.floor((lowest - 1) / 5)), 100.5)
  ax_acc.set(xlabel="round", ylabel="test accuracy (%)",
             title="Personalized test accuracy (legend: final value)")

  for ax in (ax_loss, ax_acc):
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2 if ax is ax_acc
              else 1, frameon=False, fontsize=9)
  window = summary.get("final_protocols", {}).get("window", "")
  fig.suptitle(_title(summary) + (f"\nfinal = {window}" if window else ""), fontsize=11)
  return fig
