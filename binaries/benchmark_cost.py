r"""Client cost per round: PFLEGO vs FedAvg vs FedPer, the same clients, side by side.

  python binaries/benchmark_cost.py --output_dir=runs/benchmark_cost

For each body (MLP on Fashion-MNIST High-Pers; Conv4 on Omniglot), one sampler draws
each round's clients and every algorithm runs a round on exactly those clients (tau =
50, the paper's rates), interleaved (but with `--round_runtimes=sequential`). Per client
and round it records the compute time measured inside the client computation
(`client_compute_s`: from its data being in memory to the end; `client_time_s` also
counts reading the data from the simulation's files, a cost both pay alike) and the
body passes counted at run time. The cost model allows
FedAvg / PFLEGO = tau / 2 = 25 (2 forward + 1 backward pass against tau of each);
the goal is >= 12. The round wall time (clients in parallel, what a user waits for)
is measured with each algorithm in its own TFF worker, as a user runs one algorithm
(`--round_runtimes=own`, the headline), and with all of them in one worker
(`shared`: each algorithm's round then also pays for the others' graphs and memory in
that process); the rounds alternate between the algorithms in both. Writes
benchmark_cost.json and benchmark_cost.png, and with Conv4 round times table3.md /
table3.png: the paper's Table 3 (seconds per Omniglot round) beside ours.
Table 3 alone, every algorithm, each in its own worker, one after the other (eight
Conv4 workers alive at once hold ~4 GB each on Omniglot with the spec's rotations,
more than 24 GB: the kernel killed one on 2026-11-26). In this mode each algorithm's
times are kept in <output_dir>/round_time_<body>_<algorithm>.json as it ends, with the
settings, data and machine they were measured on; a stopped benchmark run again with
the same flags keeps those that match and measures the rest:

  python binaries/benchmark_cost.py --output_dir=runs/table3 --mlp_rounds=0 \
      --mlp_round_rounds=0 --conv4_rounds=0 --conv4_round_rounds=1 \
      --round_runtimes=sequential \
      --algorithms=pflego,fedavg,fedper,fedprox,fedrep,fedbabu,ditto,fedrecon
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import contextlib
import os
import json
import time
from typing import Optional

from absl import flags
import numpy as np

from tff_pflego import files
from tff_pflego.errors import UserError
from tff_pflego.machine import this_machine


_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark_cost", "Where results go.")
_ALGORITHMS = flags.DEFINE_list("algorithms", ["pflego", "fedavg", "fedper"],
                                "Algorithms compared; the first is the reference.")
_MLP_ROUNDS = flags.DEFINE_integer("mlp_rounds", 5, "Rounds timed on Fashion-MNIST.")
_CONV4_ROUNDS = flags.DEFINE_integer("conv4_rounds", 2, "Rounds timed on Omniglot.")
_GOAL = flags.DEFINE_float("goal", 12.0, "Required FedAvg / PFLEGO client-time ratio.")
_MLP_ROUND_ROUNDS = flags.DEFINE_integer(
    "mlp_round_rounds", 10, "Rounds timed with clients in parallel (P1), Fashion-MNIST.")
_CONV4_ROUND_ROUNDS = flags.DEFINE_integer(
    "conv4_round_rounds", 3, "Rounds timed with clients in parallel (P1), Omniglot.")
ROUND_GOALS = {"mlp": 12.0, "conv4": 25.0}  # FedAvg / PFLEGO median round wall time
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
_ROUND_RUNTIMES = flags.DEFINE_list(
    "round_runtimes", ["own", "shared"],
    "How the rounds with clients in parallel (P1, Table 3) are run: 'own', each "
    "algorithm in its own TFF worker as a user runs it, rounds still alternating on "
    "the same clients (every worker alive at once); 'shared', all algorithms in one "
    "worker; 'sequential', each in its own worker, one algorithm's rounds after the "
    "other's on the same clients, one worker alive at a time (for bodies whose "
    "workers do not fit in memory together: ~4 GB each for Conv4 on Omniglot with "
    "the rotations). The first listed is the headline; each listed is measured and "
    "saved.")
_ONE_CLIENT_AT_A_TIME = flags.DEFINE_bool(
    "one_client_at_a_time", True,
    "Run one client's computation at a time, so that each client's time is its own "
    "(with clients in parallel on 2 cores, every client's time includes the others').")

BODIES = (("mlp", "fashion_mnist"), ("conv4", "omniglot"))


RUNTIMES = ("own", "shared", "sequential")
RUNTIME_TEXT = {
    "own": "each algorithm in its own TFF worker",
    "shared": "all algorithms in one TFF worker",
    "sequential": "each algorithm in its own TFF worker, one algorithm after the other"}


def measure(dataset: str, rounds: int, skip_first: bool = False,
            algorithms: Optional[list[str]] = None,
            contexts: Optional[dict] = None) -> dict:
  """Times `rounds` rounds of `algorithms` (default: all), interleaved on the same
  sampled clients (the first round left out of the statistics with `skip_first`: it
  traces the computations), each in its execution context in `contexts` (default: the
  current one). Ratios to the reference are added by `with_ratios`."""
  from tff_pflego import experiment
  from tff_pflego.algorithms import packed_metrics

  def running(name):
    import tensorflow_federated as tff
    if contexts is None:
      return contextlib.nullcontext()
    return tff.framework.get_context_stack().install(contexts[name])

  names = algorithms or _ALGORITHMS.value
  entries, data, sampler = {}, None, None
  for name in names:
    prepared, algorithm = experiment.prepare_training(dataset, name, _DATA_DIR.value)
    data, sampler = prepared.data, sampler or prepared.sampler
    with running(name):
      state = algorithm.process.initialize()
    entries[name] = dict(algorithm=algorithm, state=state, heads={},
                         next=packed_metrics.unpacking_next(algorithm.process))
  records = {name: dict(client_time_s=[], client_compute_s=[], round_time_s=[],
                        forward=[], backward=[]) for name in entries}
  sampled = []
  for round_index in range(rounds):
    clients = sampler.sample()
    ids = [data.client_ids[i] for i in clients]
    sampled.append(ids)
    for name, entry in entries.items():  # interleaved: the same clients, same load
      algorithm, heads = entry["algorithm"], entry["heads"]
      states = [heads.get(int(i)) or algorithm.initial_client_state(
          int(i), int(data.num_classes[i])) for i in clients]
      with running(name):
        start = time.monotonic()
        entry["state"], new_states, metrics = entry["next"](entry["state"], ids, states)
        elapsed = time.monotonic() - start
      heads.update({int(s["client_index"]): s for s in new_states})
      untimed = skip_first and round_index == 0
      print(f"  {dataset} round {round_index + 1}/{rounds} {name}: {elapsed:.2f} s"
            + (" (traces the computations, not timed)" if untimed else ""), flush=True)
      if untimed:
        continue
      records[name]["round_time_s"].append(elapsed)
      for c in metrics["clients"]:
        records[name]["client_time_s"].append(float(c["client_time_s"]))
        records[name]["client_compute_s"].append(float(c["client_compute_s"]))
        records[name]["forward"].append(int(c["body_forward_passes"]))
        records[name]["backward"].append(int(c["body_backward_passes"]))
  summary = {}
  for name, r in records.items():
    summary[name] = dict(client_time_s=float(np.mean(r["client_time_s"])),
                         client_compute_s=float(np.mean(r["client_compute_s"])),
                         round_time_s=float(np.mean(r["round_time_s"])),
                         round_time_median_s=float(np.median(r["round_time_s"])),
                         body_forward_passes=float(np.mean(r["forward"])),
                         body_backward_passes=float(np.mean(r["backward"])))
  return dict(dataset=dataset, rounds=rounds, clients_per_round=len(sampled[0]),
              algorithms=summary, sampled_clients=sampled)


def with_ratios(result: dict) -> dict:
  """Adds each algorithm's times relative to the reference (the first algorithm)."""
  summary = result["algorithms"]
  reference = summary[_ALGORITHMS.value[0]]
  for name in summary:
    for key in ("client_time_s", "client_compute_s", "round_time_median_s"):
      summary[name][key.replace("_s", "_vs_reference")] = (summary[name][key]
                                                          / reference[key])
  return result


def measurement_key(dataset: str, name: str, rounds: int) -> dict:
  """What a kept measurement must match: the algorithm's settings and data (its
  checkpoint fingerprint), the timed rounds and the machine."""
  from tff_pflego import experiment
  prepared, _ = experiment.prepare_training(dataset, name, _DATA_DIR.value)
  return json.loads(json.dumps(dict(fingerprint=prepared.fingerprint, rounds=rounds,
                                    machine=this_machine().label())))


def _measurement_path(body: str, name: str) -> str:
  return os.path.join(_OUTPUT_DIR.value, f"round_time_{body}_{name}.json")


def kept_measurement(body: str, dataset: str, name: str,
                     key: dict) -> Optional[dict]:
  """`name`'s sequential round times kept by an earlier invocation, if they were
  measured under `key` (`measurement_key`; else None: measure)."""
  path = _measurement_path(body, name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    kept = json.load(f)
  if kept.get("key") != key:
    print(f"  {path}: measured on other settings, data or machine; measuring again",
          flush=True)
    return None
  print(f"  {dataset} {name}: kept from {kept['measured_at']} ({path})", flush=True)
  return kept["result"]


def keep_measurement(body: str, name: str, key: dict, result: dict) -> None:
  measured_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
  result["algorithms"][name]["measured_at"] = measured_at
  files.write_json(_measurement_path(body, name),
                   dict(key=key, measured_at=measured_at, result=result))


def measure_rounds(runtimes: str, body: str, dataset: str, rounds: int) -> dict:
  """Times `rounds` rounds with clients in parallel after one untimed (tracing) round,
  run as `runtimes` says (RUNTIME_TEXT)."""
  import tensorflow_federated as tff
  from tff_pflego import runtime

  def worker(name: Optional[str] = None):
    suffix = f"_{name}" if name else ""
    return runtime.local_execution_context(
        log_path=os.path.join(_OUTPUT_DIR.value, f"tff_worker_rounds_{body}{suffix}.log"))

  if runtimes == "shared":
    with worker():
      return with_ratios(measure(dataset, rounds + 1, skip_first=True))
  if runtimes == "own":
    with contextlib.ExitStack() as stack:
      contexts = {}
      for name in _ALGORITHMS.value:
        stack.enter_context(worker(name))
        contexts[name] = tff.framework.get_context_stack().current
      return with_ratios(measure(dataset, rounds + 1, skip_first=True,
                                 contexts=contexts))
  # 'sequential': every algorithm's sampler draws the same clients from the same
  # seed, which is checked. Each algorithm's measurement is kept as it ends, so a
  # stopped benchmark goes on where it stopped.
  merged = None
  for name in _ALGORITHMS.value:
    key = measurement_key(dataset, name, rounds)
    result = kept_measurement(body, dataset, name, key)
    if result is None:
      with worker(name):
        result = measure(dataset, rounds + 1, skip_first=True, algorithms=[name])
      keep_measurement(body, name, key, result)
    if merged is None:
      merged = result
    elif result["sampled_clients"] != merged["sampled_clients"]:
      raise RuntimeError(f"{name} sampled other clients than {_ALGORITHMS.value[0]}")
    else:
      merged["algorithms"].update(result["algorithms"])
  return with_ratios(merged)


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4),
                           constrained_layout=True, squeeze=False)
  for ax, (body, result) in zip(axes[0], results.items()):
    if result["algorithms"]:  # one client at a time: each client's own compute
      names = list(result["algorithms"])
      times = [result["algorithms"][n]["client_compute_s"] for n in names]
      ratios = [result["algorithms"][n]["client_compute_vs_reference"] for n in names]
      ylabel = "client compute per round (s), data in memory"
    else:  # only rounds with the clients in parallel were timed
      names = list(result["round_time"])
      times = [result["round_time"][n]["median_s"] for n in names]
      ratios = [result["round_time"][n]["vs_reference"] for n in names]
      ylabel = "median round wall time (s), clients in parallel"
    bars = ax.bar(names, times, color=["tab:green"] + ["tab:gray"] * (len(names) - 1))
    for bar, ratio in zip(bars, ratios):
      ax.annotate(f"{ratio:.1f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                  ha="center", va="bottom")
    title = f"{body} body ({result['dataset']}), tau = 50"
    if "fedavg" in result.get("round_time", {}):
      title += (f"\nmedian round (clients in parallel): FedAvg / PFLEGO "
                f"{result['round_time']['fedavg']['vs_reference']:.1f}x, "
                f"goal {result['round_time_goal']:g}")
    ax.set_title(title, fontsize=10)
    ax.set(ylabel=ylabel)
    ax.tick_params(axis="x", labelrotation=30)
    ax.grid(axis="y", alpha=0.3)
  fig.suptitle("Cost per round, the same clients (lower is better)")
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_table_3(path: str, result: dict) -> None:
  """The paper's Table 3 (seconds per Omniglot round) beside ours, each as a ratio to
  its own PFLEGO round."""
  from tff_pflego.config import PAPER_OMNIGLOT_SECONDS_PER_ROUND as PAPER
  ours = result["round_time"]
  reference = _ALGORITHMS.value[0]
  dated = any("measured_at" in r for r in ours.values())
  lines = [f"# Seconds per round on Omniglot (the paper's Table 3 beside ours)", "",
           f"Ours: median of {result['round_time_rounds']} rounds after a first "
           "(tracing) round, every algorithm on the same sampled clients"
           + ("" if result["round_time_runtimes"] == "sequential" else ", interleaved")
           + f", clients in parallel on 2 CPU cores, "
           f"{RUNTIME_TEXT[result['round_time_runtimes']]}"
           " (`binaries/benchmark_cost.py`). The "
           "paper's: its own hardware (a GPU). Ratios: to the same column's "
           f"{reference}.", "",
           f"| algorithm | ours (s) | ours / {reference} | paper (s) | paper / "
           f"{reference} |" + (" measured |" if dated else ""),
           "|---|---|---|---|---|" + ("---|" if dated else "")]
  for name, r in ours.items():
    paper = PAPER.get(name)
    paper_ratio = (paper / PAPER[reference] if paper is not None and reference in PAPER
                   else None)
    lines.append(f"| {name} | {r['median_s']:.2f} | {r['vs_reference']:.1f}x | "
                 f"{'—' if paper is None else f'{paper:.2f}'} | "
                 f"{'—' if paper_ratio is None else f'{paper_ratio:.1f}x'} |"
                 + (f" {r.get('measured_at', '')} |" if dated else ""))
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


def plot_table_3(path: str, result: dict) -> None:
  """Each algorithm's seconds per Omniglot round as a multiple of PFLEGO's, ours beside
  the paper's (log scale: the two span 1.5x to 90x)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  from tff_pflego.config import PAPER_OMNIGLOT_SECONDS_PER_ROUND as PAPER

  reference = _ALGORITHMS.value[0]
  names = [n for n in result["round_time"] if n != reference]
  ours = [result["round_time"][n]["vs_reference"] for n in names]
  paper = [PAPER[n] / PAPER[reference] if n in PAPER else np.nan for n in names]
  x = np.arange(len(names))
  fig, ax = plt.subplots(figsize=(7.5, 4), constrained_layout=True)
  for offset, values, label, color in ((-0.2, ours, "ours, 2 CPU cores", "tab:blue"),
                                       (0.2, paper, "paper, its GPU", "tab:gray")):
    bars = ax.bar(x + offset, values, 0.4, label=label, color=color)
    for bar, value in zip(bars, values):
      center = bar.get_x() + bar.get_width() / 2
      if np.isfinite(value):
        ax.annotate(f"{value:.1f}x", (center, value), ha="center", va="bottom", fontsize=8)
      else:
        ax.annotate("not in\nthe paper", (center, 1.1), ha="center", va="bottom", fontsize=7)
  ax.set_yscale("log")
  ax.axhline(1, color="tab:green", lw=1.5, label=f"{reference} (= 1)")
  ax.set_xticks(x, names)
  ax.set(ylabel=f"seconds per round / {reference}'s")
  ax.set_title("Table 3: seconds per Omniglot round relative to "
               f"{reference} (lower is better)", fontsize=10)
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
  ax.grid(axis="y", alpha=0.3, which="both")
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  from tff_pflego import runtime
  for runtimes in _ROUND_RUNTIMES.value:
    if runtimes not in RUNTIMES:
      raise UserError(f"--round_runtimes: unknown {runtimes!r}; choose from "
                      f"{', '.join(RUNTIMES)}")
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  results = {}
  with runtime.local_execution_context(
      log_path=os.path.join(_OUTPUT_DIR.value, "tff_worker.log"),
      max_concurrent_computation_calls=1 if _ONE_CLIENT_AT_A_TIME.value else -1):
    for (body, dataset), rounds in zip(BODIES, (_MLP_ROUNDS.value, _CONV4_ROUNDS.value)):
      if rounds > 0:
        results[body] = with_ratios(measure(dataset, rounds))
  # P1: what a user waits for, a round with the clients running in parallel as in
  # every run (the worker's default), the first round (tracing) not timed.
  for number, runtimes in enumerate(_ROUND_RUNTIMES.value):
    key = "round_time" if number == 0 else f"round_time_{runtimes}_runtime"
    for (body, dataset), rounds in zip(BODIES, (_MLP_ROUND_ROUNDS.value,
                                                _CONV4_ROUND_ROUNDS.value)):
      if rounds <= 0:
        continue
      timed = measure_rounds(runtimes, body, dataset, rounds)
      results.setdefault(body, dict(dataset=dataset, algorithms={}))
      results[body][key] = {
          name: dict(median_s=r["round_time_median_s"],
                     vs_reference=r["round_time_median_vs_reference"],
                     **({"measured_at": r["measured_at"]} if "measured_at" in r else {}))
          for name, r in timed["algorithms"].items()}
      results[body]["round_time_rounds"] = rounds
      results[body]["round_time_goal"] = ROUND_GOALS[body]
      results[body][f"{key}_runtimes"] = runtimes
  with open(os.path.join(_OUTPUT_DIR.value, "benchmark_cost.json"), "w") as f:
    json.dump(results, f, indent=1)
  if "round_time" in results.get("conv4", {}):
    write_table_3(os.path.join(_OUTPUT_DIR.value, "table3.md"), results["conv4"])
    plot_table_3(os.path.join(_OUTPUT_DIR.value, "table3.png"), results["conv4"])
  plot(os.path.join(_OUTPUT_DIR.value, "benchmark_cost.png"), results)
  if any(result["algorithms"] for result in results.values()):
    print(f"\n{'body':6s} {'algorithm':9s} {'compute s':>10s} {'ratio':>7s} "
          f"{'+ data read s':>14s} {'ratio':>7s} {'fwd':>5s} {'bwd':>5s}")
  for body, result in results.items():
    for name, r in result["algorithms"].items():
      print(f"{body:6s} {name:9s} {r['client_compute_s']:10.3f} "
            f"{r['client_compute_vs_reference']:6.1f}x {r['client_time_s']:14.3f} "
            f"{r['client_time_vs_reference']:6.1f}x {r['body_forward_passes']:5.0f} "
            f"{r['body_backward_passes']:5.0f}")
    if "fedavg" in result["algorithms"]:
      ratio = result["algorithms"]["fedavg"]["client_compute_vs_reference"]
      print(f"  {body}: FedAvg / {_ALGORITHMS.value[0]} client compute = {ratio:.1f} "
            f"({'meets' if ratio >= _GOAL.value else 'misses'} the goal {_GOAL.value:g})")
    for key in [k for k in result if k.startswith("round_time") and
                isinstance(result[k], dict)]:
      for name, r in result[key].items():
        print(f"  {body}: {name:8s} median round {r['median_s']:.3f} s "
              f"({r['vs_reference']:.1f}x {_ALGORITHMS.value[0]}), clients in parallel, "
              f"{RUNTIME_TEXT[result[key + '_runtimes']]}, "
              f"{result['round_time_rounds']} rounds")
    if "fedavg" in result.get("round_time", {}):
      ratio = result["round_time"]["fedavg"]["vs_reference"]
      goal = result["round_time_goal"]
      print(f"  {body}: FedAvg / {_ALGORITHMS.value[0]} median round = {ratio:.1f} "
            f"({'meets' if ratio >= goal else 'misses'} the goal {goal:g})")


if __name__ == "__main__":
  cli.run_main(main)
