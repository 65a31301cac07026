"""A reproduction grid's results: one row per finished cell, summarized across seeds.

A cell is (dataset, degree, algorithm, seed) at some number of rounds T. The grid's
results.csv accumulates over invocations: a cell tabulated now replaces its earlier row,
rows of cells outside the current invocation are kept (running the grid on one dataset
does not erase another's tables).

A group is a (dataset, degree, algorithm); its summary for a metric is the mean over
its seeds of each seed's value (itself the mean of the run's last evaluations), and
the sample standard deviation across seeds (ddof = 1) when there are several seeds,
else the run's own std over its last evaluations. Only cells at the group's longest T
are summarized together: a shortened cell (T below the paper's) never mixes with a
full one, and is flagged.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Iterable, Mapping, Optional, Sequence

import numpy as np

CELL_KEY = ("dataset", "degree", "algorithm", "seed")
_TEXT_FIELDS = ("dataset", "degree", "algorithm", "run_dir", "varied",
                "partition_fingerprint")
_INT_FIELDS = ("seed", "rounds", "paper_rounds", "head_features_cached")


def _parse(row: dict[str, str], text_fields: Sequence[str] = ()) -> dict:
  parsed = {}
  for key, value in row.items():
    if key in _TEXT_FIELDS or key in text_fields:
      parsed[key] = value
    elif value in ("", None):
      parsed[key] = None
    elif key in _INT_FIELDS:
      parsed[key] = int(float(value))
    else:
      parsed[key] = float(value)
  return parsed


def read_results(path: str, text_fields: Sequence[str] = ()) -> list[dict]:
  """The rows of a grid's results.csv (numbers parsed, but in the columns named by
  `text_fields` and the grid's own text columns; empty cells None), or []."""
  if not os.path.exists(path):
    return []
  with open(path, newline="") as f:
    return [_parse(row, text_fields) for row in csv.DictReader(f)]


def write_results(path: str, rows: Sequence[dict], fields: Sequence[str]) -> None:
  """All rows, written to a temporary file first so a crash never leaves half a file."""
  tmp = path + ".tmp"
  with open(tmp, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  os.replace(tmp, path)


def cell_key(row: dict) -> tuple:
  return tuple(row[k] for k in CELL_KEY) + (row.get("rounds"),)


def merge(previous: Iterable[dict], fresh: Iterable[dict]) -> list[dict]:
  """`previous` with every cell that `fresh` also holds replaced by its fresh row;
  fresh cells not in `previous` appended, in their order."""
  merged = {cell_key(r): r for r in previous}
  for row in fresh:
    merged[cell_key(row)] = row
  return list(merged.values())


@dataclasses.dataclass(frozen=True)
class Summary:
  """One metric of one (dataset, degree, algorithm) across its seeds."""
  mean: float
  std: float  # across seeds (ddof 1) if n > 1, else the run's std over its window (or NaN)
  n: int  # seeds
  rounds: int
  shortened: bool  # rounds below the paper's T

  @property
  def seed_std(self) -> Optional[float]:
    """The partition-seed std, or None with a single seed."""
    return self.std if self.n > 1 else None

  def text(self, paper: Optional[float] = None) -> str:
    """A table cell, in percent: mean ± std [paper] (n=seeds) (shortened: T=rounds)."""
    cell = f"{100 * self.mean:.2f} ± {100 * self.std:.2f}"
    if paper is not None:
      cell += f" [{100 * paper:.2f}]"
    if self.n > 1:
      cell += f" (n={self.n})"
    if self.shortened:
      cell += f" (shortened: T={self.rounds})"
    return cell


def summarize(rows: Sequence[dict], dataset: str, degree: str, algorithm: str,
              metric: str) -> Optional[Summary]:
  """`metric`'s summary (e.g. 'accuracy' reads accuracy_mean / accuracy_std) over the
  group's seeds at its longest T; None if no cell of the group has a value."""
  group = [r for r in rows if (r["dataset"], r["degree"], r["algorithm"]) ==
           (dataset, degree, algorithm) and _finite(r.get(f"{metric}_mean"))]
  if not group:
    return None
  rounds = max(r["rounds"] for r in group)
  group = [r for r in group if r["rounds"] == rounds]
  means = np.array([r[f"{metric}_mean"] for r in group], np.float64)
  own_std = group[0].get(f"{metric}_std")  # None: a metric without a window std
  std = (float(np.std(means, ddof=1)) if len(group) > 1
         else math.nan if own_std is None else float(own_std))
  paper_rounds = group[0].get("paper_rounds")
  return Summary(mean=float(means.mean()), std=std, n=len(group), rounds=rounds,
                 shortened=paper_rounds is not None and rounds < paper_rounds)


@dataclasses.dataclass(frozen=True)
class Lead:
  """PFLEGO against the best baseline that ran at full length, one protocol."""
  best_baseline: Optional[str]
  lead: Optional[float]  # PFLEGO's mean minus the best baseline's (accuracy, 0..1)
  noise: Optional[float]  # the larger partition-seed std of the two (None: one seed)

  @property
  def verdict(self) -> str:
    if self.lead is None:
      return "no full-length baseline" if self.best_baseline is None else "—"
    ahead = "ahead" if self.lead > 0 else "behind"
    if self.noise is None:
      return f"{ahead}; one seed, lead not compared with a seed std"
    beyond = "by more than" if abs(self.lead) > self.noise else "within"
    return f"{ahead} {beyond} the seed std ({100 * self.noise:.2f})"


def lead(rows: Sequence[dict], dataset: str, degree: str, metric: str,
         baselines: Sequence[str], reference: str = "pflego") -> Lead:
  """`reference`'s lead over the best full-length baseline in `metric`."""
  mine = summarize(rows, dataset, degree, reference, metric)
  others = {a: summarize(rows, dataset, degree, a, metric) for a in baselines
            if a != reference}
  others = {a: s for a, s in others.items() if s is not None and not s.shortened}
  if not others:
    return Lead(None, None, None)
  best = max(others, key=lambda a: others[a].mean)
  if mine is None or mine.shortened:
    return Lead(best, None, None)
  stds = [s.seed_std for s in (mine, others[best]) if s.seed_std is not None]
  return Lead(best, mine.mean - others[best].mean, max(stds) if stds else None)


def note_for(notes: Mapping[tuple, str], dataset: str, degree: str, algorithm: str,
             protocol: str) -> Optional[str]:
  """The most specific of `notes` for a cell's protocol: keyed (dataset, degree,
  algorithm, protocol), else (dataset, algorithm, protocol), else (algorithm,
  protocol); None if none is."""
  for key in ((dataset, degree, algorithm, protocol), (dataset, algorithm, protocol),
              (algorithm, protocol)):
    if key in notes:
      return notes[key]
  return None


def largest_rise(losses: Sequence[float]) -> float:
  """max_t L_t / min_{s <= t} L_s over a run's evaluations: 1 for a loss that never
  rises above its best so far; 2 if it once doubled from its lowest point."""
  losses = np.asarray(losses, np.float64)
  return float(np.max(losses / np.minimum.accumulate(losses)))


def _finite(value) -> bool:
  return value is not None and not (isinstance(value, float) and math.isnan(value))


def legend_label(algorithm: str, seeds_by_degree: dict[str, int],
                 shortened_rounds: Optional[int] = None) -> str:
  """One legend entry per algorithm, whatever the panels: its seed count when it drew
  several ("5 seeds", or "5 seeds at High" when the degrees differ), and T when it is
  shortened."""
  counts = set(seeds_by_degree.values())
  label = algorithm
  if counts == {max(counts)} and max(counts) > 1:
    label += f" ({max(counts)} seeds)"
  elif len(counts) > 1:
    label += " (" + ", ".join(f"{n} seeds at {degree.capitalize()}"
                              for degree, n in seeds_by_degree.items() if n > 1) + ")"
  if shortened_rounds is not None:
    label += f" (shortened: T={shortened_rounds})"
  return label
