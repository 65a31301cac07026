r"""What one body pass costs on this machine, and how much of a run's round it explains.

  python binaries/benchmark_body_pass.py --output_dir=runs/benchmark_body_pass \
      --runs=runs/reproduce/omniglot/high/fedbabu/seed0_T100

On a CPU a round's time is its body passes (README, Table 3), so the seconds of one
body's forward pass, and of one forward and backward pass, on one client's batch are the
unit a machine's round times are counted in, and the ratio of two machines' units is
the ratio of their rounds. For each body at the paper's client size (the mean training
examples per client of the paper's setting: Fashion-MNIST High 600, CIFAR-10 High 500,
Omniglot with its rotations 1958), a `tf.function` over a batch of that many examples
(values drawn from a normal: a pass's cost does not depend on them) is timed `--repeats`
times after one untimed call; the median is kept.

With `--runs` (run directories made on this machine: config.json and rounds.csv, or a
record's rounds.csv.gz), each run's body is also timed at its clients' mean size and its
median round is set beside the body passes the round counted (rounds.csv's
body_forward_passes F and body_backward_passes B per client; a backward pass comes with
its forward pass):

  predicted round = clients per round x ((F - B) x forward + B x (forward + backward))

What the round takes beyond that (its `unexplained` share) is everything but the
counted passes: the clients' evaluation passes, data reads, aggregation and the server
step. Writes body_pass.json and body_pass.png to --output_dir and prints both tables.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import csv
import dataclasses
import gzip
import json
import os
import statistics
import time

from absl import flags

from tff_pflego import files
from tff_pflego.errors import UserError
from tff_pflego.machine import this_machine
from tff_pflego.training import run_files

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark_body_pass",
                                  "Where results go.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls per pass (the median is kept).",
                                lower_bound=1)
_RUNS = flags.DEFINE_list("runs", [], "Run directories made on this machine whose "
                          "median round is compared with its body passes.")

# Mean training examples per client in the paper's setting (the records' rounds.csv,
# num_examples / num_reports over the run).
PAPER_CLIENTS = {"fashion_mnist": 600, "cifar10": 500, "omniglot": 1958}
_DATASETS = flags.DEFINE_list(
    "datasets", list(PAPER_CLIENTS),
    f"Bodies timed at the paper's client size, named by their dataset: any of "
    f"{', '.join(PAPER_CLIENTS)} (none: only --runs).")


def time_passes(dataset: str, examples: int, repeats: int) -> dict:
  """Median seconds of one forward, and one forward + backward, pass of `dataset`'s body
  over a batch of `examples`."""
  import tensorflow as tf
  from tff_pflego.data import sources
  from tff_pflego.models import bodies

  spec = sources.get_dataset_spec(dataset)
  body = bodies.build_body(spec.body, spec.image_shape, seed=0)
  batch = tf.random.stateless_normal((examples, *spec.image_shape), seed=(0, 1))

  @tf.function
  def forward():
    return tf.reduce_sum(body(batch))

  @tf.function
  def forward_backward():
    with tf.GradientTape() as tape:
      total = tf.reduce_sum(body(batch))
    return tape.gradient(total, body.trainable_variables)

  def median_seconds(fn) -> float:
    fn()  # traces
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      tf.nest.map_structure(lambda t: t.numpy(), fn())
      times.append(time.perf_counter() - start)
    return statistics.median(times)

  return dict(dataset=dataset, body=spec.body, examples=examples,
              forward_s=median_seconds(forward),
              forward_backward_s=median_seconds(forward_backward))


def read_run(run_dir: str) -> dict:
  """A run's dataset, and per round its time, clients, examples and body passes."""
  try:
    with open(os.path.join(run_dir, run_files.CONFIG_FILE)) as f:
      config = json.load(f)
    path = os.path.join(run_dir, run_files.ROUNDS_FILE)
    opener = open if os.path.exists(path) else gzip.open
    path = path if os.path.exists(path) else path + ".gz"
    with opener(path, "rt") as f:
      rows = [r for r in csv.DictReader(f) if r["num_reports"] not in ("", "0")]
  except (OSError, ValueError, KeyError) as e:
    raise UserError(f"--runs {run_dir}: not a run directory ({e})") from None
  if not rows:
    raise UserError(f"--runs {run_dir}: no round with reports yet")

  def median(column: str) -> float:
    return statistics.median(float(r[column]) for r in rows)

  return dict(run_dir=run_dir, dataset=config["dataset"], algorithm=config["algorithm"],
              rounds=len(rows), round_s=median("round_time_s"),
              clients=median("num_reports"),
              examples=round(statistics.mean(float(r["num_examples"]) / float(r["num_reports"])
                                             for r in rows)),
              forward_passes=median("body_forward_passes"),
              backward_passes=median("body_backward_passes"))


def predicted_round_s(run: dict, passes: dict) -> float:
  """clients x ((F - B) forward passes + B forward-and-backward passes)."""
  forward_only = run["forward_passes"] - run["backward_passes"]
  return run["clients"] * (forward_only * passes["forward_s"]
                           + run["backward_passes"] * passes["forward_backward_s"])


def _plot_bodies(ax, results: dict) -> None:
  import numpy as np
  bodies = results["bodies"]
  x = np.arange(len(bodies))
  for offset, key, label in ((-0.2, "forward_s", "forward"),
                             (0.2, "forward_backward_s", "forward + backward")):
    ms = [1e3 * b[key] for b in bodies]
    bars = ax.bar(x + offset, ms, 0.4, label=label)
    ax.bar_label(bars, labels=[f"{v:.0f}" if v >= 10 else f"{v:.1f}" for v in ms])
  ax.set_xticks(x, [f"{b['body']}\n{b['dataset']}, {b['examples']} ex." for b in bodies])
  ax.set_yscale("log")
  ax.set(ylabel="ms per pass over one client's batch (log)",
         title=f"{results['machine']['cpu']} ({', '.join(results['machine']['extensions'])}),"
               f" {results['machine']['cores']} cores")
  ax.legend()


def _plot_runs(ax, results: dict) -> None:
  import numpy as np
  runs = results["runs"]
  x = np.arange(len(runs))
  ax.bar(x, [r["predicted_round_s"] for r in runs], 0.6, label="its body passes",
         color="tab:blue")
  bars = ax.bar(x, [r["round_s"] - r["predicted_round_s"] for r in runs], 0.6,
                bottom=[r["predicted_round_s"] for r in runs], label="the rest",
                color="tab:gray")
  ax.bar_label(bars, labels=[f"{r['round_s']:.1f} s" for r in runs])
  ax.set_xticks(x, [f"{r['algorithm']}\n{r['dataset']}" for r in runs])
  ax.set(ylabel="median round (s)", title="A run's round: body passes and the rest")
  ax.legend()


def plot(path: str, results: dict) -> None:
  """One panel for the bodies timed at the paper's sizes, one for the runs (each if any)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [draw for draw, key in ((_plot_bodies, "bodies"), (_plot_runs, "runs"))
            if results[key]]
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4),
                           constrained_layout=True, squeeze=False)
  for draw, ax in zip(panels, axes[0]):
    draw(ax, results)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def check(argv) -> list[dict]:
  """Before TensorFlow loads: the datasets named and the runs; returns the runs read."""
  unknown = sorted(set(_DATASETS.value) - set(PAPER_CLIENTS))
  if unknown:
    raise UserError(f"--datasets: {', '.join(unknown)} not one of {', '.join(PAPER_CLIENTS)}")
  if not _DATASETS.value and not _RUNS.value:
    raise UserError("nothing to measure: --datasets is empty and no --runs given")
  return [read_run(d) for d in _RUNS.value]


def main(argv) -> None:
  runs = check(argv)
  repeats = _REPEATS.value
  results = dict(machine=dataclasses.asdict(this_machine()), repeats=repeats,
                 measured_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 bodies=[time_passes(d, PAPER_CLIENTS[d], repeats)
                         for d in _DATASETS.value], runs=[])
  print(f"{results['machine']}\n  {'body':9s} {'dataset':14s} {'examples':>8s} "
        f"{'forward':>9s} {'fwd+bwd':>9s}")
  for b in results["bodies"]:
    print(f"  {b['body']:9s} {b['dataset']:14s} {b['examples']:8d} "
          f"{b['forward_s']:8.3f}s {b['forward_backward_s']:8.3f}s")
  for run in runs:
    passes = time_passes(run["dataset"], run["examples"], repeats)
    predicted = predicted_round_s(run, passes)
    results["runs"].append(run | dict(passes=passes, predicted_round_s=predicted,
                                      unexplained=1 - predicted / run["round_s"]))
    print(f"  {run['run_dir']}: median round {run['round_s']:.2f} s over "
          f"{run['rounds']} rounds; its body passes ({run['clients']:g} clients x "
          f"{run['forward_passes']:g} forward, {run['backward_passes']:g} backward at "
          f"{run['examples']} examples) {predicted:.2f} s; the rest "
          f"{100 * (1 - predicted / run['round_s']):.0f} %")
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  files.write_json(os.path.join(_OUTPUT_DIR.value, "body_pass.json"), results)
  plot(os.path.join(_OUTPUT_DIR.value, "body_pass.png"), results)
  print(f"  wrote {_OUTPUT_DIR.value}/body_pass.json, body_pass.png")


if __name__ == "__main__":
  cli.run_main(main, check=check)
