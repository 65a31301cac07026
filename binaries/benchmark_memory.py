r"""Memory over long runs (P4).

  python binaries/benchmark_memory.py --output_dir=runs/benchmark_memory

Each algorithm of --algorithms trains --rounds rounds at the paper's Fashion-MNIST
High-Pers setting (I = 100, r = 20, tau = 50, all clients evaluated every 100 rounds
and at the last 10) through `run_experiment`, in this process. A thread samples every
second the resident memory of this process (the driver) and of its TFF worker, and
the round reached (rows of rounds.csv). Goal: driver + worker at the last round
<= 1.1x their value at round 50.

All-client evaluation at a large population (its time and the worker's peak memory)
is measured by binaries/benchmark_population.py.

Writes benchmark_memory.json and benchmark_memory.png to --output_dir; parts run
earlier into the same directory are kept (e.g. --algorithms=fedavg adds FedAvg's run
to an earlier PFLEGO one).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import os
import json
import threading
import time
from typing import Callable

from absl import flags
import numpy as np
import psutil

from tff_pflego.training import run_files


_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark_memory", "Where results go.")
_ALGORITHMS = flags.DEFINE_list("algorithms", ["pflego", "fedavg"], "Algorithms run.")
_ROUNDS = flags.DEFINE_integer("rounds", 1000, "Rounds per algorithm (P4).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
_GOAL_GROWTH = 1.1


def _rss_mb(process: psutil.Process) -> float:
  try:
    return process.memory_info().rss / 2**20
  except psutil.NoSuchProcess:
    return float("nan")


def _workers() -> list[psutil.Process]:
  return [c for c in psutil.Process().children(recursive=True)
          if c.name() == "worker_binary"]


class MemorySampler:
  """Samples driver and worker resident memory, with a progress value, every period."""

  def __init__(self, progress: Callable[[], float], period_s: float = 1.0):
    self.samples: list[dict] = []
    self._progress, self._period = progress, period_s
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self) -> None:
    me, start = psutil.Process(), time.monotonic()
    while not self._stop.wait(self._period):
      workers = _workers()
      self.samples.append(dict(
          t=time.monotonic() - start, progress=self._progress(), driver_mb=_rss_mb(me),
          worker_mb=sum(_rss_mb(w) for w in workers) if workers else float("nan")))

  def __enter__(self) -> "MemorySampler":
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()


def _rows(path: str) -> int:
  try:
    with open(path) as f:
      return max(0, sum(1 for _ in f) - 1)
  except OSError:
    return 0


def _at_round(samples: list[dict], round_num: int, key: str) -> float:
  """The median of `key` over the samples taken while `round_num` was the last round."""
  values = [s[key] for s in samples if s["progress"] == round_num and s[key] == s[key]]
  if not values:  # no sample landed in that round: the nearest later one
    later = [s for s in samples if s["progress"] >= round_num and s[key] == s[key]]
    values = [later[0][key]] if later else [float("nan")]
  return float(np.median(values))


def rounds_part(algorithm: str, rounds: int) -> dict:
  from tff_pflego.experiment import ExperimentConfig, run_experiment
  output_dir = os.path.join(_OUTPUT_DIR.value, f"{algorithm}_rounds")
  config = ExperimentConfig(dataset="fashion_mnist", personalization="high",
                            algorithm=algorithm, rounds=rounds, eval_every=100,
                            checkpoint_every=100, output_dir=output_dir, overwrite=True,
                            progress=False)
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  rounds_csv = os.path.join(output_dir, run_files.ROUNDS_FILE)
  with MemorySampler(lambda: _rows(rounds_csv)) as sampler:
    summary = run_experiment(config)
  samples = sampler.samples
  early = min(50, rounds)
  total = {r: _at_round(samples, r, "driver_mb") + _at_round(samples, r, "worker_mb")
           for r in (early, rounds - 1)}
  return dict(algorithm=algorithm, rounds=rounds, samples=samples,
              time_per_round_s=summary["time_per_round_s"],
              total_mb_at=dict(zip(("early", "last"), total.values())),
              early_round=early, last_round=rounds - 1,
              growth_ratio=total[rounds - 1] / total[early], goal_ratio=_GOAL_GROWTH)


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 1, figsize=(6.2, 4.2), constrained_layout=True,
                           squeeze=False)
  ax = axes[0][0]
  for name, r in results["rounds"].items():
    s = [x for x in r["samples"] if x["worker_mb"] == x["worker_mb"]]
    ax.plot([x["progress"] for x in s], [x["driver_mb"] + x["worker_mb"] for x in s],
            lw=2, label=f"{name}: driver + worker ({r['growth_ratio']:.2f}x "
                        f"round {r['last_round']} / {r['early_round']})")
    ax.plot([x["progress"] for x in s], [x["worker_mb"] for x in s], lw=1, ls="--",
            label=f"{name}: worker alone")
  ax.set(xlabel="round", ylabel="resident memory (MB)", ylim=(0, None),
         title="Memory per round, Fashion-MNIST High-Pers, paper setting")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  path = os.path.join(_OUTPUT_DIR.value, "benchmark_memory.json")
  results: dict = {"rounds": {}}
  if os.path.exists(path):  # parts run earlier into this directory are kept
    with open(path) as f:
      results = json.load(f)
  for name in _ALGORITHMS.value:
    results["rounds"][name] = rounds_part(name, _ROUNDS.value)
    r = results["rounds"][name]
    print(f"{name}: driver + worker {r['total_mb_at']['early']:.0f} MB at round "
          f"{r['early_round']}, {r['total_mb_at']['last']:.0f} MB at round "
          f"{r['last_round']}: {r['growth_ratio']:.2f}x (goal <= {_GOAL_GROWTH})", flush=True)
  results.pop("evaluation", None)  # measured by benchmark_population.py now
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
  plot(os.path.join(_OUTPUT_DIR.value, "benchmark_memory.png"), results)
  print(f"wrote {_OUTPUT_DIR.value}/benchmark_memory.json, benchmark_memory.png")


if __name__ == "__main__":
  cli.run_main(main)
