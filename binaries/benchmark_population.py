r"""Large populations (P3): the training round and all-client evaluation at I = 10,000.

  python binaries/benchmark_population.py --output_dir=runs/benchmark_population

EMNIST-Letters High-Pers at I = --num_clients (10,000: 12 to 13 train and 2 test
examples per client), PFLEGO at the paper's rates, r = 20, tau = 50, in one process
and one TFF runtime:

1. Training round, I = 10,000 against I = 100 at equal per-client data: the I = 100
   population is the first 100 clients of the same partition (the same files), with
   their own client-data computations, sampler, q = r / I and N. Rounds alternate
   between the two, the first of each untimed (tracing). Goal: median round at
   I = 10,000 <= 1.2x the median at I = 100.
2. All-client evaluation at I = 10,000, --evaluations times in a row, by the driver's
   path (cohorts: one client computation per cohort of clients, reading the cohort's
   files in one pipeline), --evaluations times, and, for reference, by one computation
   per client (the path personal bodies need), --per_client_evaluations times,
   alternating: seconds per evaluation and per client, growth
   from the first evaluation to the last, and the worker's peak resident memory.
   Goals: <= 10 s per evaluation (~1 ms per client), no growth, peak <= 2 GB.
3. Sampled evaluation (`--eval_clients=N`): the mean test accuracy of a seeded sample
   of N clients with its standard error, against the all-client mean of the same state.

Writes benchmark_population.json and benchmark_population.png to --output_dir.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import dataclasses
import json
import os
import threading
import time

from absl import flags
import numpy as np
import psutil

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark_population",
                                  "Where results go.")
_NUM_CLIENTS = flags.DEFINE_integer("num_clients", 10_000, "The large population I.")
_SMALL = flags.DEFINE_integer("small_num_clients", 100, "The small population.")
_ROUNDS = flags.DEFINE_integer("rounds", 20, "Timed rounds per population.")
_EVALUATIONS = flags.DEFINE_integer("evaluations", 5, "All-client evaluations in cohorts.")
_PER_CLIENT_EVALUATIONS = flags.DEFINE_integer(
    "per_client_evaluations", 2, "All-client evaluations one client at a time (~80 s each).")
_SAMPLE = flags.DEFINE_integer("eval_clients", 500, "Size of the sampled evaluation.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
GOALS = dict(round_ratio=1.2, evaluation_s=10.0, peak_gb=2.0)


class PeakMemory:
  """The TFF worker's resident memory, sampled every 50 ms; `peak()` since `reset()`."""

  def __init__(self, pid: int):
    self._process, self._peak = psutil.Process(pid), 0.0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.wait(0.05):
      self._peak = max(self._peak, self._process.memory_info().rss / 2**20)

  def reset(self) -> None:
    self._peak = self._process.memory_info().rss / 2**20

  def peak(self) -> float:
    return self._peak

  def stop(self) -> None:
    self._stop.set()


def _population(data, prepared, size: int, clients_per_round: int):
  """(algorithm, client ids, sampler) of a population of the first `size` clients."""
  from tff_pflego.data import federated
  from tff_pflego.data.client_data import client_data_computations
  from tff_pflego.experiment import training_algorithm
  from tff_pflego.training.sampling import ClientSampler

  ids = list(data.client_ids[:size])
  parts = {}
  for part in ("train", "test"):
    parts[part] = federated.ClientFiles(dict(zip(ids, data.client_files[part][:size])),
                                        data.read_client_files)

  sampler = ClientSampler(size, clients_per_round=clients_per_round, seed=0)
  config = dataclasses.replace(
      prepared.algorithm_config, participation_prob=sampler.participation_prob,
      total_examples=int(data.num_train_examples[:size].sum()))
  algorithm = training_algorithm(
      "pflego", config, client_data_computations(parts["train"], parts["test"]))
  return algorithm, ids, sampler


def training_rounds(data, prepared) -> dict:
  from tff_pflego.algorithms import packed_metrics
  from tff_pflego.training.client_store import ClientStateStore

  runs = {}
  for size in (_SMALL.value, data.num_clients):
    algorithm, ids, sampler = _population(data, prepared, size, 20)
    runs[size] = dict(algorithm=algorithm, ids=ids, sampler=sampler,
                      next=packed_metrics.unpacking_next(algorithm.process),
                      state=algorithm.process.initialize(), times=[],
                      store=ClientStateStore(lambda i, a=algorithm: a.initial_client_state(
                          i, int(data.num_classes[i]))))
  for round_index in range(_ROUNDS.value + 1):
    for run in runs.values():  # alternating: the same load for both
      chosen = run["sampler"].sample()
      start = time.monotonic()
      run["state"], states, _ = run["next"](
          run["state"], [run["ids"][i] for i in chosen], run["store"].get(chosen))
      run["store"].update(states, chosen)
      if round_index > 0:
        run["times"].append(time.monotonic() - start)
  small, large = (np.median(runs[s]["times"]) for s in (_SMALL.value, data.num_clients))
  return dict(small_num_clients=_SMALL.value, num_clients=data.num_clients,
              clients_per_round=20, rounds=_ROUNDS.value,
              train_examples_per_client=dict(
                  small=float(data.num_train_examples[:_SMALL.value].mean()),
                  large=float(data.num_train_examples.mean())),
              small_round_s=[float(t) for t in runs[_SMALL.value]["times"]],
              large_round_s=[float(t) for t in runs[data.num_clients]["times"]],
              small_median_s=float(small), large_median_s=float(large),
              ratio=float(large / small), goal=GOALS["round_ratio"],
              large_state=runs[data.num_clients])


def evaluations(data, trained: dict, worker_pid: int) -> dict:
  from tff_pflego.training import driver, evaluation

  run = trained["large_state"]
  algorithm = run["algorithm"]
  weights = algorithm.body_weights(run["state"])
  indices = np.arange(data.num_clients)
  states = run["store"].get(indices)
  per_client = evaluation.build_personalized_evaluation(
      algorithm.body_fn, algorithm.types, data.train.dataset_computation,
      data.test.dataset_computation)
  paths = {
      "cohorts": driver.build_client_evaluation(algorithm, data),
      "per_client": lambda w, i, s: evaluation.per_client_table(
          per_client(w, [data.client_ids[j] for j in i], s)),
  }
  memory = PeakMemory(worker_pid)
  results = {name: dict(seconds=[], worker_peak_mb=[]) for name in paths}
  tables = {}
  repeats = dict(cohorts=_EVALUATIONS.value, per_client=_PER_CLIENT_EVALUATIONS.value)
  for index in range(max(repeats.values())):
    for name, evaluate in paths.items():
      if index >= repeats[name]:
        continue
      memory.reset()
      start = time.monotonic()
      tables[name] = evaluate(weights, indices, states)
      results[name]["seconds"].append(time.monotonic() - start)
      results[name]["worker_peak_mb"].append(memory.peak())
  memory.stop()
  for name, r in results.items():
    r["ms_per_client"] = [1000 * s / data.num_clients for s in r["seconds"]]
    r["growth_last_vs_first"] = r["seconds"][-1] / r["seconds"][0]
  a, b = tables["cohorts"], tables["per_client"]
  same = {k: float(np.max(np.abs(a[k] - b[k]))) for k in a}
  summary = evaluation.summarize(a)
  sample = evaluation.evaluation_sample(data.num_clients, _SAMPLE.value, seed=0)
  sampled = evaluation.summarize({k: v[sample] for k, v in a.items()},
                                 population=data.num_clients)
  return dict(num_clients=data.num_clients, paths=results, goal_s=GOALS["evaluation_s"],
              goal_peak_gb=GOALS["peak_gb"], largest_difference_between_paths=same,
              all_clients_mean=summary["test_accuracy_mean"],
              sampled=dict(size=_SAMPLE.value, mean=sampled["test_accuracy_mean"],
                           standard_error=sampled["test_accuracy_mean_se"]))


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), constrained_layout=True)
  r = results["rounds"]
  ax = axes[0]
  ax.boxplot([r["small_round_s"], r["large_round_s"]],
             labels=[f"I = {r['small_num_clients']}", f"I = {r['num_clients']:,}"])
  ax.set(ylabel="round wall time (s)", ylim=(0, None),
         title=f"PFLEGO round, r = 20, ~{r['train_examples_per_client']['large']:.0f} "
               f"examples per client: {r['ratio']:.2f}x (goal <= {r['goal']})")
  ax.grid(axis="y", alpha=0.3)
  e = results["evaluation"]
  ax = axes[1]
  for name, style in (("cohorts", "-o"), ("per_client", "--s")):
    p = e["paths"][name]
    ax.plot(range(1, len(p["seconds"]) + 1), p["seconds"], style,
            label=f"{name.replace('_', ' ')}: {np.mean(p['ms_per_client']):.2f} ms/client, "
                  f"worker peak {max(p['worker_peak_mb']):.0f} MB")
  ax.axhline(e["goal_s"], color="gray", ls=":", label=f"goal {e['goal_s']:g} s")
  ax.set_xticks(range(1, max(len(p["seconds"]) for p in e["paths"].values()) + 1))
  ax.set(xlabel="evaluation (in a row)", ylabel="seconds", ylim=(0, None),
         title=f"All-client evaluation, I = {e['num_clients']:,} (EMNIST-Letters)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  from tff_pflego import experiment, runtime

  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  config = experiment.ExperimentConfig(
      dataset="emnist_letters", personalization="high", num_clients=_NUM_CLIENTS.value,
      clients_per_round=20, output_dir=os.path.join(_OUTPUT_DIR.value, "tmp"),
      overwrite=True)
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  prepared = experiment.prepare(experiment.resolve(config))
  data = prepared.data
  with runtime.local_execution_context(
      log_path=os.path.join(_OUTPUT_DIR.value, "tff_worker.log")) as worker:
    rounds = training_rounds(data, prepared)
    results = dict(rounds={k: v for k, v in rounds.items() if k != "large_state"},
                   evaluation=evaluations(data, rounds, worker.pid))
  with open(os.path.join(_OUTPUT_DIR.value, "benchmark_population.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(os.path.join(_OUTPUT_DIR.value, "benchmark_population.png"), results)
  r, e = results["rounds"], results["evaluation"]
  print(f"training round: I = {r['small_num_clients']} {r['small_median_s']:.3f} s, "
        f"I = {r['num_clients']} {r['large_median_s']:.3f} s (median of {r['rounds']}): "
        f"{r['ratio']:.2f}x (goal <= {r['goal']})")
  for name, p in e["paths"].items():
    print(f"all-client evaluation, I = {e['num_clients']}, {name}: "
          + ", ".join(f"{s:.2f}" for s in p["seconds"])
          + f" s ({np.mean(p['ms_per_client']):.2f} ms per client; last/first "
          f"{p['growth_last_vs_first']:.2f}); worker peak {max(p['worker_peak_mb']):.0f} MB")
  print(f"paths agree to {max(e['largest_difference_between_paths'].values()):.1e}; "
        f"sampled evaluation of {e['sampled']['size']} clients: "
        f"{e['sampled']['mean']:.4f} +- {e['sampled']['standard_error']:.4f} (SE), "
        f"all clients {e['all_clients_mean']:.4f}")
  print(f"wrote {_OUTPUT_DIR.value}/benchmark_population.json, benchmark_population.png")


if __name__ == "__main__":
  cli.run_main(main)
