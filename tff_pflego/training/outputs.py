"""Run outputs written directly: clients.csv, summary.json and the curves PNG."""

from __future__ import annotations

import csv
import json
import os
from typing import Mapping, Sequence

import numpy as np


class CsvWriter:
  """Appends rows to a CSV file, flushing each one so a killed run loses nothing."""

  def __init__(self, path: str, fieldnames: Sequence[str]):
    self.path = path
    self._file = open(path, "w", newline="")
    self._writer = csv.DictWriter(self._file, fieldnames=list(fieldnames),
                                  extrasaction="ignore")
    self._writer.writeheader()
    self._file.flush()

  def write(self, row: Mapping) -> None:
    self._writer.writerow({k: _plain(v) for k, v in row.items()})
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def _plain(value):
  if isinstance(value, (np.floating, float)):
    return f"{float(value):.6g}"
  if isinstance(value, np.ndarray):
    return " ".join(str(v) for v in value.tolist())
  if isinstance(value, np.integer):
    return int(value)
  return value


def write_json(path: str, data: Mapping) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2, default=_plain)
    f.write("\n")
  os.replace(tmp, path)


def plot_curves(path: str, title: str, rounds: Sequence[int], train_loss: Sequence[float],
                accuracy: Mapping[str, tuple[Sequence[int], Sequence[float]]],
                reference: float | None = None) -> None:
  """Two panels: train loss L(psi) and test accuracy per round, as a PNG."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
  ax_loss.plot(rounds, train_loss, color="tab:blue", lw=2)
  ax_loss.set_yscale("log")
  ax_loss.set(xlabel="round", ylabel="train loss L(ψ) (log scale)",
              title="Training objective, all clients")
  for label, (x, y) in accuracy.items():
    ax_acc.plot(x, 100 * np.asarray(y), lw=2 if "all" in label else 1.2,
                alpha=1.0 if "all" in label else 0.7, label=label)
  if reference is not None:
    ax_acc.axhline(100 * reference, color="gray", ls="--", lw=1, label="paper")
  ax_acc.set(xlabel="round", ylabel="test accuracy (%)", title="Personalized test accuracy")
  finals = [np.asarray(y)[-10:].mean() for _, y in accuracy.values() if len(y)]
  if finals:
    ax_acc.set_ylim(max(0, 100 * min(finals) - 15), 100.5)
  ax_acc.legend(loc="lower right")
  for ax in (ax_loss, ax_acc):
    ax.grid(alpha=0.3)
  fig.suptitle(title)
  fig.savefig(path, dpi=120)
  plt.close(fig)
