r"""PFLEGO benchmark: accuracy at the paper's setting, and TFF's overhead per round.

  python binaries/benchmark_pflego.py --output_dir=runs/benchmark

1. Accuracy: Fashion-MNIST, High-Pers, I=100, r=20, tau=50, T=200, beta=.006,
   rho=.002, Adam (the paper's experiment, `binaries/train.py` defaults); checks
   `final.test_accuracy_sampled_pooled` and `final.test_accuracy_mean` against
   --target_accuracy. `--accuracy_run=DIR` reuses a finished run instead.
2. Overhead: the same PFLEGO rounds (same clients, same client function
   `pflego.make_client_update`, same optimizer) run (a) under TFF's runtime, (b) as a
   plain `tf.function` loop reading the client files (then cached) and (c) as the same
   loop over client data held in memory as tensors, interleaved round by round in one
   process; the bodies after the rounds must agree. Goal: TFF / plain <= 1.3.
   Every round also records max |theta_TFF - theta_plain| and, as the yardstick of
   float32 rounding, the same difference between the in-memory loop and an untimed
   copy of it that sums the clients' updates in reverse order (the only difference
   between the two); `--server_optimizer=sgd` runs the rounds without Adam's
   normalized steps, which turn last-bit differences into steps of up to rho.

Writes benchmark.json and benchmark.png to --output_dir and prints a table.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import os
import collections
import json
import time

from absl import flags
import numpy as np

from tff_pflego import config
from tff_pflego import settings
from tff_pflego.training import run_files


_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark", "Where results go.")
_ACCURACY_RUN = flags.DEFINE_string(
    "accuracy_run", None, "A finished paper-setting run to read instead of training.")
_SKIP_ACCURACY = flags.DEFINE_bool("skip_accuracy", False, "Only measure the overhead.")
_OVERHEAD_ROUNDS = flags.DEFINE_integer("overhead_rounds", 20, "Rounds timed per mode.")
_TARGET = flags.DEFINE_float("target_accuracy", 0.975, "Accuracy goal (fraction).")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
# The overhead rounds' server optimizer and rate; unset: the paper's (Adam, .002).
_SERVER = settings.define_flags(__name__, names=("server_optimizer", "server_lr"))


def accuracy_part(output_dir: str) -> dict:
  from tff_pflego.experiment import ExperimentConfig, run_experiment
  if _ACCURACY_RUN.value:
    with open(os.path.join(_ACCURACY_RUN.value, run_files.SUMMARY_FILE)) as f:
      summary = json.load(f)
  else:
    config = ExperimentConfig(dataset="fashion_mnist", personalization="high",
                              eval_every=10, output_dir=os.path.join(output_dir, "paper_run"),
                              overwrite=True)
    if _DATA_DIR.value:
      config.data_dir = _DATA_DIR.value
    summary = run_experiment(config)
  final = summary["final"]
  return dict(run=summary.get("partition_manifest"), final=final,
              time_per_round_s=summary["time_per_round_s"],
              wall_time_s=summary["wall_time_s"],
              meets_target={k: final[k] >= _TARGET.value for k in
                            ("test_accuracy_mean", "test_accuracy_sampled_pooled")})


def overhead_part(num_rounds: int) -> dict:
  import tensorflow as tf
  import tensorflow_federated as tff
  from tff_pflego import runtime
  from tff_pflego.algorithms import (instrumentation, packed_metrics, pflego,
                                     server_optimizers)
  from tff_pflego.algorithms.registry import build_algorithm
  from tff_pflego.config import paper_defaults
  from tff_pflego.data import load_federated_data
  from tff_pflego.training.client_store import ClientStateStore
  from tff_pflego.training.sampling import ClientSampler

  kwargs = {"data_dir": _DATA_DIR.value} if _DATA_DIR.value else {}
  data = load_federated_data("fashion_mnist", "high", 100, seed=0, **kwargs)
  sampler = ClientSampler(100, clients_per_round=20, seed=0)
  paper = paper_defaults("fashion_mnist", "pflego", "high")
  server_lr = _SERVER["server_lr"].value
  config = settings.algorithm_config(
      body="mlp", image_shape=(28, 28, 1), max_classes=2,
      total_examples=int(data.num_train_examples.sum()), participation_prob=0.2,
      local_steps=paper.local_steps, client_lr=paper.client_lr,
      server_lr=paper.server_lr if server_lr is None else server_lr,
      server_optimizer=_SERVER["server_optimizer"].value or paper.server_optimizer,
      prox_mu=0.0)
  hparams = dict(local_steps=config.local_steps, client_lr=config.client_lr,
                 server_lr=config.server_lr,
                 participation_prob=config.participation_prob,
                 total_examples=config.total_examples,
                 head_step=config.head_step, head_optimizer=config.head_optimizer)

  with runtime.local_execution_context():
    algorithm = build_algorithm("pflego", config, data.client_data_computations)
    process = algorithm.process
    state = process.initialize()
    next_round = packed_metrics.unpacking_next(process)  # as the driver runs a round

    # Plain TF: the same client function, a Keras body, the same TFF optimizer, eager;
    # once with each client's data read through the same tf_fn (then cached), once
    # with it held in memory as tensors (an in-memory PFLEGO written the obvious way).
    body = algorithm.body_fn()
    update = tf.function(pflego.make_client_update(
        body, instrumentation.BodyPassCounter(), max_classes=2, **hparams))
    optimizer = server_optimizers.build_server_optimizer(config.server_optimizer,
                                                         config.server_lr)

    def file_dataset(i):
      return data.train.create_tf_dataset_for_client(data.client_ids[i]).cache()

    def memory_dataset(i):
      x, y = data.client_arrays(i)
      return tf.data.Dataset.from_tensors({"x": tf.constant(x), "y": tf.constant(y)})

    def make_plain_round(dataset_of, reverse_sum: bool = False):
      theta = [tf.constant(w) for w in state.model.trainable]
      opt_state = optimizer.initialize([tf.TensorSpec(w.shape, w.dtype) for w in theta])
      cached = {}

      def plain_round(indices, states):
        nonlocal theta, opt_state
        weights = tff.learning.models.ModelWeights(trainable=theta, non_trainable=[])
        summands, new_states = [], []
        for i, s in zip(indices, states):
          if i not in cached:
            cached[i] = dataset_of(i)
          out = update(weights, cached[i], s)
          n = float(out["update_weight"])
          summands.append([n * u for u in out["update"]])
          new_states.append(tf.nest.map_structure(lambda t: t.numpy(),
                                                  out["client_state"]))
        if reverse_sum:
          summands.reverse()
        weighted = summands[0]
        for g in summands[1:]:
          weighted = [a + b for a, b in zip(weighted, g)]
        estimate = [w / (config.participation_prob * config.total_examples)
                    for w in weighted]
        opt_state, theta = optimizer.next(opt_state, theta, estimate)
        return new_states

      plain_round.body = lambda: [t.numpy() for t in theta]
      return plain_round

    plain = {"plain": make_plain_round(file_dataset),
             "plain_memory": make_plain_round(memory_dataset)}
    untimed = {"plain_memory_reversed": make_plain_round(memory_dataset,
                                                         reverse_sum=True)}
    init = lambda i: algorithm.initial_client_state(i, 2)
    stores = {name: ClientStateStore(init) for name in ("tff", *plain, *untimed)}
    times, differences = collections.defaultdict(list), collections.defaultdict(list)
    for r in range(num_rounds + 1):  # round 0 warms all up (tracing) and is not timed
      indices = sampler.sample()
      t0 = time.perf_counter()
      state, states, _ = next_round(state, [data.client_ids[i] for i in indices],
                                    stores["tff"].get(indices))
      elapsed = {"tff": time.perf_counter() - t0}
      stores["tff"].update(states, indices)
      for name, plain_round in plain.items():
        t0 = time.perf_counter()
        new_states = plain_round(indices, stores[name].get(indices))
        elapsed[name] = time.perf_counter() - t0
        stores[name].update(new_states, indices)
      for name, plain_round in untimed.items():
        stores[name].update(plain_round(indices, stores[name].get(indices)), indices)
      if r > 0:
        for name, seconds in elapsed.items():
          times[name].append(seconds)
      bodies = {"tff": state.model.trainable, **{
          name: p.body() for name, p in {**plain, **untimed}.items()}}
      for a, b in (("tff", "plain"), ("tff", "plain_memory"),
                   ("plain_memory", "plain_memory_reversed")):
        differences[f"{a}_vs_{b}"].append(_max_abs_difference(bodies[a], bodies[b]))
    max_diff = max(differences["tff_vs_plain"][-1],
                   differences["tff_vs_plain_memory"][-1])
  median = {name: float(np.median(t)) for name, t in times.items()}
  return dict(rounds=num_rounds, clients_per_round=20, local_steps=50,
              tff_round_s=median["tff"], plain_round_s=median["plain"],
              plain_memory_round_s=median["plain_memory"],
              ratio=median["tff"] / median["plain"],
              ratio_vs_memory=median["tff"] / median["plain_memory"], goal_ratio=1.3,
              server_optimizer=config.server_optimizer, server_lr=config.server_lr,
              max_abs_body_difference=max_diff,
              body_difference_per_round=dict(differences), times=dict(times))


def _max_abs_difference(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [p for p in ("overhead", "accuracy") if p in results]
  if "body_difference_per_round" in results.get("overhead", {}):
    panels.insert(1, "difference")
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4),
                           constrained_layout=True, squeeze=False)
  for ax, panel in zip(axes[0], panels):
    if panel == "overhead":
      o = results["overhead"]
      bars = ax.bar(["plain TF,\nclient files", "plain TF,\nin memory", "TFF runtime"],
                    [o["plain_round_s"], o["plain_memory_round_s"], o["tff_round_s"]],
                    color=["tab:gray", "silver", "tab:blue"])
      ax.bar_label(bars, fmt="%.3f s")
      ax.set(ylabel="seconds per round (median)",
             title=f"Same PFLEGO rounds: TFF / plain = {o['ratio']:.2f},\n"
                   f"TFF / in-memory = {o['ratio_vs_memory']:.2f} (goal ≤ 1.3)")
    elif panel == "difference":
      o = results["overhead"]
      labels = {"tff_vs_plain": "TFF vs plain loop",
                "tff_vs_plain_memory": "TFF vs in-memory loop",
                "plain_memory_vs_plain_memory_reversed":
                    "in-memory loop vs itself, clients summed in reverse"}
      for key, label in labels.items():
        values = o["body_difference_per_round"][key]
        ax.semilogy(range(1, len(values) + 1), np.maximum(values, 1e-10), label=label)
      ax.axhline(o["server_lr"], color="gray", ls=":", label=f"rho = {o['server_lr']:g}")
      ax.set(xlabel="round (the first untimed)", ylabel="max |body difference|",
             title=f"Same rounds, server optimizer {o['server_optimizer']}")
      ax.legend(loc="upper left", fontsize=8)
    else:
      final = results["accuracy"]["final"]
      keys = ["test_accuracy_mean", "test_accuracy_sampled_pooled"]
      bars = ax.bar(["all clients\n(mean)", "sampled clients\n(pooled, ref. code)"],
                    [100 * final[k] for k in keys], color=["tab:blue", "tab:green"])
      ax.bar_label(bars, fmt="%.2f")
      ax.axhline(100 * _TARGET.value, color="tab:red", ls="--", label="target")
      paper = 100 * config.PAPER_ACCURACY[("fashion_mnist", "pflego", "high")]
      ax.axhline(paper, color="gray", ls=":", label=f"paper ({paper:.2f})")
      ax.set(ylim=(85, 100), ylabel="test accuracy (%)",
             title="Fashion-MNIST High-Pers, paper setting")
      ax.legend(loc="lower right")
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  results = {}
  if not _SKIP_ACCURACY.value:
    results["accuracy"] = accuracy_part(_OUTPUT_DIR.value)
  results["overhead"] = overhead_part(_OVERHEAD_ROUNDS.value)
  with open(os.path.join(_OUTPUT_DIR.value, "benchmark.json"), "w") as f:
    json.dump(results, f, indent=2)
  plot(os.path.join(_OUTPUT_DIR.value, "benchmark.png"), results)
  o = results["overhead"]
  print(f"\nTFF overhead over {o['rounds']} rounds (20 clients, tau=50), median s/round:")
  print(f"  plain tf.function {o['plain_round_s']:.3f}   in memory "
        f"{o['plain_memory_round_s']:.3f}   TFF {o['tff_round_s']:.3f}   "
        f"ratio {o['ratio']:.2f} / vs in-memory {o['ratio_vs_memory']:.2f} (goal <= 1.3)   "
        f"max |theta_TFF - theta_plain| = {o['max_abs_body_difference']:.2e}")
  if "accuracy" in results:
    a = results["accuracy"]
    for key, ok in a["meets_target"].items():
      print(f"  {key:30s} {a['final'][key]:.4f}  "
            f"{'meets' if ok else 'MISSES'} target {_TARGET.value}")
  print(f"  wrote {_OUTPUT_DIR.value}/benchmark.json, benchmark.png")


if __name__ == "__main__":
  cli.run_main(main)
