r"""How far a finished run's heads are from what its body allows: every client refits
its head on the run's last body, from its stored head or from zero, for a number of
full-batch head steps, and is scored on its train (L(psi)) and test data.

  python binaries/refit_probe.py --run_dir=runs/reproduce/cifar10/medium/pflego/seed0 \
      --steps=49,490 --starts=stored,zero

The evaluation's refit protocol is `--steps=tau-1 --starts=stored` (the steps a sampled
client takes, at the client rate beta and with the run's head optimizer). Reads the run's
latest checkpoint (refused if it belongs to another run); writes refit_probe.json into
--run_dir and prints a table. Clients never sampled keep their initial heads.

Staleness (issue #14 §0: why L(psi) with the stored heads rises): a client's head is
refitted only in rounds that sample it, and the body moves in between. The run's seeded
client sampler is replayed to the checkpoint's round (refused unless the replay ends in
the checkpoint's own sampler state), giving each client's age, the rounds since it last
reported; the clients are grouped by age and each group's mean L_i with the stored heads
is set beside its mean after the tau - 1 step refit. Written to refit_probe.json
("staleness") and drawn as refit_probe_staleness.png. With Adam at the server, how far
the body moved in the checkpoint's round ("server_step": per layer, the step relative
to the round's rate and Adam's effective per-weight SGD rate; ||step|| / ||theta||).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import json
import os

from absl import flags

from tff_pflego.errors import UserError

_RUN_DIR = flags.DEFINE_string("run_dir", None, "A finished (or checkpointed) run.",
                               required=True)
_STEPS = flags.DEFINE_list("steps", ["49"], "Head steps of each refit.")
_STARTS = flags.DEFINE_list("starts", ["stored", "zero"],
                            "Where each refit starts: a client's stored head, or zero.")
STARTS = ("stored", "zero")
# Age groups (rounds since a client last reported; inclusive bounds, None: no upper).
AGE_GROUPS = ((0, 0), (1, 4), (5, 9), (10, 19), (20, None))


def last_reports(sampler, run):
  """The round in which each client last reported (0: never), from `sampler` (the
  run's, freshly seeded) replayed to the checkpoint `run` (a RunState). Raises
  RuntimeFailure unless the replay ends in the sampler state the run saved. (A stored
  state does not mean a report: evaluation stores every client's initial head.)"""
  import numpy as np
  from tff_pflego.errors import RuntimeFailure
  last = np.zeros(sampler.num_clients, np.int64)
  for round_num in range(1, run.round_num + 1):
    last[sampler.sample()] = round_num
  if sampler.state != run.sampler_state:
    raise RuntimeFailure(f"the client sampler replayed for {run.round_num} rounds does "
                         "not match the checkpoint: the run's sampling cannot be "
                         "reconstructed")
  return last


def staleness(ages, table: dict) -> dict:
  """Per age group (`AGE_GROUPS`; age -1, never sampled, apart): the clients, their
  mean age, their mean L_i with the stored heads and after the refit, and their mean
  test accuracy each way. `table`: a per-client evaluation with a refit."""
  import numpy as np
  groups = [(f"{low}" if low == high else f"{low}-{high}" if high is not None
             else f">={low}", (ages >= low) & ((ages <= high) if high is not None else True))
            for low, high in AGE_GROUPS] + [("never", ages < 0)]
  rows = []
  for label, members in groups:
    if not members.any():
      continue
    rows.append(dict(
        age=label, clients=int(members.sum()), mean_age=float(np.mean(ages[members])),
        train_loss=float(np.mean(table["train_loss"][members])),
        refit_train_loss=float(np.mean(table["refit_train_loss"][members])),
        test_accuracy=float(np.mean(table["test_accuracy"][members])),
        refit_test_accuracy=float(np.mean(table["refit_test_accuracy"][members]))))
  return dict(ages=[int(a) for a in ages],
              train_loss=[float(v) for v in table["train_loss"]],
              refit_train_loss=[float(v) for v in table["refit_train_loss"]],
              groups=rows)


def server_step(run, algorithm, config) -> dict | None:
  """How far the body moved in the checkpoint's round, when the server runs Adam: per
  layer, the step each weight took relative to that round's rate rho_t (median, the
  fraction that moved at least 0.1 rho_t) and Adam's effective rate per weight
  (`server_optimizers.adam_effective_rates`: the SGD rate that would have taken that
  step); for the body, ||step|| / ||theta||. None for another server optimizer, and
  (printed) when the optimizer steps other weights than the body's."""
  import numpy as np
  import tensorflow as tf
  from tff_pflego.algorithms import server_optimizers
  adam = server_optimizers.adam_state(getattr(run.server_state, "finalizer", None))
  if adam is None or run.round_num < 1:
    return None
  rate = server_optimizers.rate_at(config, run.round_num - 1)
  steps = server_optimizers.adam_last_step(adam, rate)
  rates = server_optimizers.adam_effective_rates(adam, rate)
  body = [np.asarray(w, np.float64)
          for w in tf.nest.flatten(algorithm.body_weights(run.server_state))]
  if [w.shape for w in body] != [s.shape for s in steps]:
    print(f"  the body's step is not summarized: the server optimizer steps "
          f"{[list(s.shape) for s in steps]}, not the body's "
          f"{[list(w.shape) for w in body]}", flush=True)
    return None

  def stats(step, effective):
    moved = np.abs(step) / rate
    return dict(weights=int(step.size), median_step_over_rate=float(np.median(moved)),
                fraction_at_least_tenth_rate=float(np.mean(moved >= 0.1)),
                median_effective_rate=float(np.median(effective)))

  whole = stats(np.concatenate([s.ravel() for s in steps]),
                np.concatenate([r.ravel() for r in rates]))
  norm = lambda arrays: float(np.sqrt(sum(np.sum(a ** 2) for a in arrays)))
  return dict(rate=rate, body=whole | dict(relative_step=norm(steps) / norm(body)),
              layers=[dict(shape=list(s.shape)) | stats(s, r) for s, r in zip(steps, rates)])


def plot_staleness(result: dict, path: str) -> None:
  """Each client's L_i against its age: stored head, and after the refit."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  stale = result["staleness"]
  ages = np.array(stale["ages"])
  seen = ages >= 0
  fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
  for key, label, color in (("train_loss", "stored head", "C3"),
                            ("refit_train_loss", f"after {result['refit_steps']} head "
                             "steps (refit)", "C0")):
    values = np.array(stale[key])
    ax.scatter(ages[seen], values[seen], s=14, alpha=0.6, color=color, label=label)
    groups = [g for g in stale["groups"] if g["age"] != "never"]
    ax.plot([g["mean_age"] for g in groups], [g[key] for g in groups], color=color, lw=2)
  ax.set(yscale="log", xlabel="rounds since the client's head was last refitted (its "
         "last report)", ylabel="client's train loss L_i",
         title=f"{result['run_dir']}, round {result['round']}\nlines: the mean of "
               "each age group")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def probe(run_dir: str, steps: list[int], starts: list[str]) -> dict:
  import numpy as np
  from tff_pflego import experiment, runtime
  from tff_pflego.training import driver, evaluation

  config = experiment.load_run_config(run_dir, "--run_dir")
  prepared = experiment.prepare(config)
  data = prepared.data
  with runtime.local_execution_context():
    algorithm = experiment.training_algorithm(config.algorithm, prepared.algorithm_config)
    run = driver.checkpoint_manager(algorithm, data, run_dir,
                                    prepared.fingerprint).load_latest()
    indices = np.arange(data.num_clients)
    stored = [run.client_states.get(int(i)) or algorithm.initial_client_state(
        int(i), int(data.num_classes[i])) for i in indices]
    zero = [dict(s, head={k: np.zeros_like(v) for k, v in s["head"].items()})
            for s in stored]
    body = algorithm.body_weights(run.server_state)
    results, tables = {}, {}
    protocol_steps = config.local_steps - 1
    for count in sorted(set(steps) | {protocol_steps}):
      refit = evaluation.HeadRefit(count, config.client_lr, config.head_optimizer)
      evaluate = driver.build_client_evaluation(algorithm, data, refit=refit)
      for start in starts if count in steps else ("stored",):
        tables[start, count] = table = evaluate(
            body, indices, stored if start == "stored" else zero)
        if count not in steps:
          continue
        summary = evaluation.summarize(table)
        row = dict(start=start, steps=count, train_loss=summary["train_loss_refit"],
                   test_accuracy_mean=summary["test_accuracy_refit_mean"])
        results[f"{start}/{count}"] = row
        print(f"  from {start:6s} heads, {count:5d} steps: L(psi) "
              f"{row['train_loss']:.4f}, test accuracy "
              f"{100 * row['test_accuracy_mean']:.2f} %")
    last = last_reports(prepared.sampler, run)
    step = server_step(run, algorithm, prepared.algorithm_config)
  ages = np.where(last > 0, run.round_num - last, -1)
  result = dict(run_dir=run_dir, round=run.round_num, client_lr=config.client_lr,
                head_optimizer=config.head_optimizer, results=results,
                refit_steps=protocol_steps,
                staleness=staleness(ages, tables["stored", protocol_steps]),
                server_step=step)
  print(f"  by rounds since the last report (stored head -> after {protocol_steps} head "
        "steps):")
  for group in result["staleness"]["groups"]:
    print(f"    age {group['age']:>5s}: {group['clients']:4d} clients, L_i "
          f"{group['train_loss']:.4f} -> {group['refit_train_loss']:.4f}, test accuracy "
          f"{100 * group['test_accuracy']:.2f} -> {100 * group['refit_test_accuracy']:.2f} %")
  if step is not None:
    body = step["body"]
    print(f"  the body's step in round {run.round_num} (Adam, rho_t = {step['rate']:.3g}): "
          f"||step|| / ||theta|| = {body['relative_step']:.4f}; median |step| / rho_t "
          f"{body['median_step_over_rate']:.4f}, at least 0.1 rho_t in "
          f"{100 * body['fraction_at_least_tenth_rate']:.1f} % of the weights; per layer, "
          "median effective SGD rate: " + ", ".join(
              f"{layer['median_effective_rate']:.3g}" for layer in step["layers"]))
  return result


def check(argv) -> list[int]:
  """Before TensorFlow loads: the starts, the steps, a run to probe; returns the steps."""
  from tff_pflego.experiment_config import load_run_config
  starts = [s for s in _STARTS.value if s not in STARTS]
  if starts:
    raise UserError(f"--starts: unknown {starts}; choose from {list(STARTS)}")
  try:
    steps = [int(s) for s in _STEPS.value]
  except ValueError:
    raise UserError(f"--steps must be integers, got {_STEPS.value}") from None
  if any(s < 0 for s in steps):
    raise UserError(f"--steps must be >= 0, got {steps}")
  load_run_config(_RUN_DIR.value, "--run_dir")
  return steps


def main(argv) -> None:
  steps = check(argv)
  result = probe(_RUN_DIR.value, steps, _STARTS.value)
  path = os.path.join(_RUN_DIR.value, "refit_probe.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=2)
  plot_staleness(result, os.path.join(_RUN_DIR.value, "refit_probe_staleness.png"))
  print(f"  wrote {path} and refit_probe_staleness.png")


if __name__ == "__main__":
  cli.run_main(main, check=check)
