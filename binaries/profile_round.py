r"""Where one round's wall time goes: a profile of PFLEGO's and FedAvg's rounds.

  python binaries/profile_round.py --output_dir=docs

For each algorithm at the paper's Fashion-MNIST High-Pers setting (I = 100, r = 20,
tau = 50), on the same sampled clients, rounds alternating, the first untimed, twice:
with the clients in parallel (as every run executes them: the round a user waits for),
and one client computation at a time, where each client's in-graph timestamps are its
own and the round splits into

  data             sum over clients of reading its data (files -> one batch in memory)
  compute          sum over clients of its computation from its data in memory to the end
  outside clients  round - sum of the clients' whole times: broadcast, aggregation, the
                   server optimizer, metrics, and moving values between driver and worker
  intrinsics       the federated intrinsics in `next` (counted in its computation), and
                   the measured cost of one over 20 clients in this runtime (a
                   federated_sum of a scalar; a federated_map then sum)

Writes round_profile.json and prints a table (docs/round_profile.md quotes it).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import json
import os
import time

from absl import flags
import numpy as np

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/profile_round", "Where results go.")
_ALGORITHMS = flags.DEFINE_list("algorithms", ["pflego", "fedavg"], "Algorithms profiled.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Timed rounds per algorithm.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")


def intrinsic_cost(num_clients: int = 20, repeats: int = 10) -> dict:
  """Seconds for one federated_sum, and one federated_map + federated_sum, of a scalar
  over `num_clients` clients (the difference of 9 and 1 of them, / 8)."""
  import tensorflow_federated as tff

  @tff.tensorflow.computation(np.float32)
  def add_one(x):
    return x + 1.0

  def build(k: int, mapped: bool):
    @tff.federated_computation(tff.FederatedType(np.float32, tff.CLIENTS))
    def sums(x):
      return [tff.federated_sum(tff.federated_map(add_one, x) if mapped else x)
              for _ in range(k)]
    return sums

  values = [np.float32(i) for i in range(num_clients)]
  result = {}
  for mapped in (False, True):
    times = {}
    for k in (1, 9):
      computation = build(k, mapped)
      computation(values)
      start = time.monotonic()
      for _ in range(repeats):
        computation(values)
      times[k] = (time.monotonic() - start) / repeats
    result["map_and_sum_s" if mapped else "sum_s"] = (times[9] - times[1]) / 8
  return result


def profile(names: list[str], rounds: int, split: bool) -> dict:
  """Medians over `rounds` rounds of each algorithm in the current context; with
  `split` (one client computation at a time) also the round's data / compute / outside
  parts. Clients that overlap have no such split: their times sum past the round."""
  from tff_pflego import experiment
  from tff_pflego.algorithms import inspection, instrumentation, packed_metrics
  from tff_pflego.training.client_store import ClientStateStore

  runs, data, sampler = {}, None, None
  for name in names:
    prepared, algorithm = experiment.prepare_training("fashion_mnist", name,
                                                      _DATA_DIR.value)
    data, sampler = prepared.data, sampler or prepared.sampler
    runs[name] = dict(algorithm=algorithm, state=algorithm.process.initialize(),
                      next=packed_metrics.unpacking_next(algorithm.process),
                      store=ClientStateStore(lambda i, a=algorithm: a.initial_client_state(
                          i, int(data.num_classes[i]))),
                      round_s=[], splits=[])
  for round_index in range(rounds + 1):
    chosen = sampler.sample()
    ids = [data.client_ids[i] for i in chosen]
    for run in runs.values():
      start = time.monotonic()
      run["state"], states, metrics = run["next"](run["state"], ids,
                                                 run["store"].get(chosen))
      elapsed = time.monotonic() - start
      run["store"].update(states, chosen)
      if round_index == 0:
        continue
      run["round_s"].append(elapsed)
      if split:
        run["splits"].append(instrumentation.split_round(
            elapsed, [float(c["client_time_s"]) for c in metrics["clients"]],
            [float(c["client_compute_s"]) for c in metrics["clients"]]))
  results = {}
  for name, run in runs.items():
    median = dict(round_s=float(np.median(run["round_s"])))
    if split:
      median.update({part: float(np.median([getattr(s, part) for s in run["splits"]]))
                     for part in instrumentation.RoundSplit._fields})
    intrinsics = inspection.count_intrinsics(run["algorithm"].process.next)
    results[name] = dict(rounds=rounds, clients_per_round=len(ids), **median,
                         intrinsics=dict(intrinsics),
                         num_intrinsics=int(sum(intrinsics.values())))
  return results


def main(argv) -> None:
  from tff_pflego import runtime

  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  results = {}
  for mode, calls in (("parallel", -1), ("one_client_at_a_time", 1)):
    with runtime.local_execution_context(
        log_path=os.path.join(_OUTPUT_DIR.value, f"tff_worker_{mode}.log"),
        max_concurrent_computation_calls=calls):
      results[mode] = profile(_ALGORITHMS.value, _ROUNDS.value, split=calls == 1)
      if mode == "parallel":
        results["one_intrinsic_over_20_clients"] = intrinsic_cost()
  with open(os.path.join(_OUTPUT_DIR.value, "round_profile.json"), "w") as f:
    json.dump(results, f, indent=1)
  cost = results["one_intrinsic_over_20_clients"]
  print(f"one intrinsic over 20 clients: federated_sum {1000 * cost['sum_s']:.1f} ms, "
        f"federated_map + federated_sum {1000 * cost['map_and_sum_s']:.1f} ms")
  print(f"{'algorithm':9s} {'round':>7s} | one client at a time: {'round':>7s} {'data':>7s} "
        f"{'compute':>8s} {'outside':>8s} | intrinsics   (seconds, medians)")
  for name, parallel in results["parallel"].items():
    r = results["one_client_at_a_time"][name]
    print(f"{name:9s} {parallel['round_s']:7.3f} | {'':21s} {r['round_s']:7.3f} "
          f"{r['data_s']:7.3f} {r['compute_s']:8.3f} {r['outside_clients_s']:8.3f} | "
          f"{r['num_intrinsics']}: " + ", ".join(
              f"{k} {v}" for k, v in sorted(r["intrinsics"].items())))
  print(f"wrote {_OUTPUT_DIR.value}/round_profile.json")


if __name__ == "__main__":
  cli.run_main(main)
