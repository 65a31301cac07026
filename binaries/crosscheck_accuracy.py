r"""Cross-checks PFLEGO's accuracy outside TFF, and bounds it from above.

  python binaries/crosscheck_accuracy.py --tff_run=runs/fashion_mnist_high \
      --output_dir=runs/crosscheck

The accuracy of the TFF process (issue #2's benchmark) is checked against

1. an independent implementation of Algorithm 1: plain TensorFlow, one client after the
   other, none of the project's client code (the closed-form head steps, the tape, the
   estimator and Keras' Adam are written here again). It starts from the same body,
   heads and client sample as `train.py` (same seed), so its curve should follow the
   TFF run's within noise. `--head_optimizer=gd` shows what plain GD does at the paper's
   beta; `--partition_seeds` repeats it on other partitions (the class pairs a seed
   draws move the mean by about a point);
2. two central references, trained on all clients' training examples at once:
   - PFLEGO's objective L(psi) itself (same body, one head per client) minimized with
     minibatch Adam, its best epoch chosen on the test data: an optimistic bound on what
     minimizing L(psi) generalizes to on this partition, whatever the optimizer;
   - the same MLP trained 10-way, each client then scored with the logits of its own
     classes only (a shared head: a different estimator, not a bound on L(psi)'s).

Writes crosscheck.json and crosscheck.png (all-client mean test accuracy per round).
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import json
import os

from absl import flags
import numpy as np
import tqdm

from tff_pflego import records
from tff_pflego.errors import UserError
from tff_pflego.training import ceiling
from tff_pflego.training import run_files


_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/crosscheck", "Where results go.")
_TFF_RUN = flags.DEFINE_string("tff_run", None, "A train.py run to compare with.")
_DATASET = flags.DEFINE_string("dataset", "fashion_mnist", "Dataset.")
_PERSONALIZATION = flags.DEFINE_string("personalization", "high", "Degree.")
_ROUNDS = flags.DEFINE_integer("rounds", None, "T (default: the paper's).")
_PARTITION_SEEDS = flags.DEFINE_list("partition_seeds", ["0"], "Seeds (partition, "
                                     "initialization and sampling), one run each.")
_HEAD_OPTIMIZER = flags.DEFINE_enum("head_optimizer", "monotone_gd", ["gd", "monotone_gd"],
                                    "Head-only steps: plain GD or non-increasing GD.")
_CENTRAL_EPOCHS = flags.DEFINE_integer("central_epochs", 20, "Upper bound's epochs.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")
WINDOW = 10


def _client_data(data):
  import tensorflow as tf
  return [{part: tuple(tf.constant(a) for a in data.client_arrays(i, part))
           for part in ("train", "test")} for i in range(data.num_clients)]


def _seeds() -> list[int]:
  try:
    seeds = [int(s) for s in _PARTITION_SEEDS.value]
  except ValueError:
    seeds = []
  if not seeds or min(seeds) < 0:
    raise UserError(f"--partition_seeds must be integers >= 0, got "
                    f"{','.join(_PARTITION_SEEDS.value)!r}")
  return seeds


def _resolved(seed: int):
  """The resolved settings of `train.py` for these flags and seed (no TensorFlow)."""
  from tff_pflego.experiment_config import ExperimentConfig, resolve
  config = ExperimentConfig(
      dataset=_DATASET.value, personalization=_PERSONALIZATION.value, seed=seed,
      rounds=_ROUNDS.value, output_dir=os.path.join(_OUTPUT_DIR.value, "unused"))
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  return resolve(config)


def _prepared(seed: int):
  """The resolved settings and prepared data of `train.py` for these flags and seed."""
  from tff_pflego import experiment
  c = _resolved(seed)
  return c, experiment.prepare(c)


def independent_pflego(seed: int, c, p) -> dict:
  """Algorithm 1 in plain TF, clients one by one; all-client evaluation per round."""
  import tensorflow as tf
  from tff_pflego.models import build_body
  from tff_pflego.algorithms.model_types import initial_client_state

  data, sampler, a = p.data, p.sampler, p.algorithm_config
  clients = _client_data(data)
  body = build_body(a.body, a.image_shape, a.seed)
  theta = body.trainable_variables
  heads = [initial_client_state(i, int(data.num_classes[i]), body.output_shape[-1],
                                       a.max_classes, a.seed)["head"]
           for i in range(data.num_clients)]
  heads = [{k: tf.constant(v) for k, v in h.items()} for h in heads]
  alpha = data.num_train_examples / data.num_train_examples.sum()
  scale = 1.0 / sampler.participation_prob  # I / r
  adam = tf.keras.optimizers.Adam(a.server_lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7)

  def loss(logits, y, k):
    masked = tf.where(tf.range(a.max_classes) < k, logits, -1e9)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, masked))

  @tf.function(reduce_retracing=True)
  def client(x, y, k, w, b, alpha_i):
    phi = body(x)  # features once
    lr = tf.constant(c.client_lr)
    for _ in tf.range(c.local_steps - 1):  # head-only steps, no body pass
      with tf.GradientTape() as tape:
        tape.watch([w, b])
        current = loss(phi @ w + b, y, k)
      gw, gb = tape.gradient(current, [w, b])
      new_w, new_b = w - lr * gw, b - lr * gb
      new_value = loss(phi @ new_w + new_b, y, k)
      if _HEAD_OPTIMIZER.value == "gd" or new_value <= current:
        w, b = new_w, new_b
      else:
        lr = lr / 2
    with tf.GradientTape() as tape:  # the joint gradient at (W_i, theta_{t-1})
      tape.watch([w, b])
      joint = loss(body(x) @ w + b, y, k)
    g_theta, g_w, g_b = tape.gradient(joint, [theta, w, b])
    head_lr = a.server_lr * scale * (alpha_i if a.head_step == "exact" else 1.0)
    return [scale * alpha_i * g for g in g_theta], w - head_lr * g_w, b - head_lr * g_b

  @tf.function(reduce_retracing=True)
  def accuracy(x, y, k, w, b):
    logits = tf.where(tf.range(a.max_classes) < k, body(x) @ w + b, -1e9)
    return tf.reduce_mean(tf.cast(tf.argmax(logits, -1, output_type=tf.int32) == y,
                                  tf.float32))

  curve = []
  for round_num in tqdm.trange(1, c.rounds + 1, desc=f"plain TF, seed {seed}",
                               unit="round", dynamic_ncols=True):
    estimate = [tf.zeros_like(v) for v in theta]
    for i in sampler.sample():
      x, y = clients[i]["train"]
      g, w, b = client(x, y, int(data.num_classes[i]), heads[i]["kernel"],
                       heads[i]["bias"], float(alpha[i]))
      estimate = [e + gi for e, gi in zip(estimate, g)]
      heads[i] = dict(kernel=w, bias=b)
    adam.apply_gradients(zip(estimate, theta))
    if round_num % c.eval_every == 0 or round_num > c.rounds - WINDOW:
      accs = [float(accuracy(*clients[i]["test"], int(data.num_classes[i]),
                             heads[i]["kernel"], heads[i]["bias"]))
              for i in range(data.num_clients)]
      curve.append((round_num, float(np.mean(accs))))
  final = float(np.mean([acc for _, acc in curve[-WINDOW:]]))
  return dict(seed=seed, final_test_accuracy_mean=final, curve=curve,
              head_optimizer=_HEAD_OPTIMIZER.value)


def central_upper_bound(seed: int, data) -> dict:
  """The MLP trained centrally (10-way); each client scored on its own classes."""
  import tensorflow as tf
  from tff_pflego.models import build_body

  tf.keras.utils.set_random_seed(seed)
  classes = data.partition.class_sets
  x, y, ids = ceiling.pooled(data, "train")
  global_y = np.concatenate([classes[i][y[ids == i]] for i in range(data.num_clients)])
  model = tf.keras.Sequential([
      build_body(data.spec.body, data.spec.image_shape, seed),
      tf.keras.layers.Dense(data.spec.num_classes)])
  model.compile(tf.keras.optimizers.Adam(1e-3),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(x, global_y, batch_size=128, epochs=_CENTRAL_EPOCHS.value, verbose=0,
            shuffle=True)
  x, y, ids = ceiling.pooled(data, "test")
  logits = model.predict(x, verbose=0, batch_size=1000)
  correct = np.zeros(len(y), bool)
  for i in range(data.num_clients):  # each client's own K_i classes
    rows = ids == i
    correct[rows] = np.argmax(logits[rows][:, classes[i]], -1) == y[rows]
  return dict(seed=seed, epochs=_CENTRAL_EPOCHS.value,
              test_accuracy_mean=ceiling.client_mean_accuracy(correct, ids, data.num_clients))


def tff_curve(run_dir: str) -> tuple[list, float]:
  """A train.py run's all-client mean accuracy per evaluation, and its final figure."""
  try:
    with open(os.path.join(run_dir, run_files.METRICS_FILE)):
      pass  # read_rows takes a missing file for an empty one
    rows = [r for r in records.read_rows(os.path.join(run_dir, run_files.METRICS_FILE))
            if r["round"] > 0]
    with open(os.path.join(run_dir, run_files.SUMMARY_FILE)) as f:
      final = float(json.load(f)["final"]["test_accuracy_mean"])
    return [(int(r["round"]), float(r["test_accuracy_mean"])) for r in rows], final
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise UserError(f"--tff_run {run_dir} is not a finished train.py run: {e}") from None


def plot(path: str, results: dict) -> None:
  """Accuracy per round; each seed's central references in its curve's colour."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
  if "tff" in results:
    rounds, accs = zip(*results["tff"]["curve"])
    ax.plot(rounds, 100 * np.array(accs), lw=3, color="black", alpha=0.35,
            label=f"TFF process {100 * results['tff']['final_test_accuracy_mean']:.2f}")
  central = {b["seed"]: b for b in results["central"]}
  own = {b["seed"]: b for b in results.get("central_personalized", [])}
  for color, run in enumerate(results["independent"]):
    rounds, accs = zip(*run["curve"])
    seed, c = run["seed"], f"C{color}"
    ax.plot(rounds, 100 * np.array(accs), lw=1.4, ls="--", color=c,
            label=f"seed {seed}: plain TF {100 * run['final_test_accuracy_mean']:.2f}")
    if seed in own:
      ax.axhline(100 * own[seed]["best_test_accuracy_mean"], color=c, ls="-.", lw=1,
                 label=f"seed {seed}: central L(psi), best epoch "
                       f"{100 * own[seed]['best_test_accuracy_mean']:.2f}")
    if seed in central:
      ax.axhline(100 * central[seed]["test_accuracy_mean"], color=c, ls=":", lw=1,
                 label=f"seed {seed}: central 10-way MLP "
                       f"{100 * central[seed]['test_accuracy_mean']:.2f}")
  ax.set(xlabel="round", ylabel="mean test accuracy over all clients (%)", ylim=(90, 100),
         title=f"PFLEGO, {_DATASET.value} {_PERSONALIZATION.value}: TFF, plain TF and "
               "central references")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower right", ncol=1 + (len(results["independent"]) > 2))
  fig.savefig(path, dpi=120)
  plt.close(fig)


def check(argv) -> None:
  """Before TensorFlow loads: the seeds, every seed's settings, the run to compare."""
  for seed in _seeds():
    _resolved(seed)
  if _TFF_RUN.value:
    tff_curve(_TFF_RUN.value)


def main(argv) -> None:
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  results = {}
  if _TFF_RUN.value:
    curve, final = tff_curve(_TFF_RUN.value)
    results["tff"] = dict(run=_TFF_RUN.value, curve=curve, final_test_accuracy_mean=final)
  results.update(independent=[], central=[], central_personalized=[])
  for seed in _seeds():
    c, p = _prepared(seed)  # the data once per seed, for all three
    results["independent"].append(independent_pflego(seed, c, p))
    results["central"].append(central_upper_bound(seed, p.data))
    results["central_personalized"].append(
        ceiling.central_objective_ceiling(p.data, seed, _CENTRAL_EPOCHS.value))
  with open(os.path.join(_OUTPUT_DIR.value, "crosscheck.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(os.path.join(_OUTPUT_DIR.value, "crosscheck.png"), results)
  print("\nall-client mean test accuracy, mean of the last 10 evaluations:")
  if "tff" in results:
    print(f"  TFF process ({_TFF_RUN.value}): {results['tff']['final_test_accuracy_mean']:.4f}")
  for run, bound, own in zip(results["independent"], results["central"],
                             results["central_personalized"]):
    print(f"  seed {run['seed']}: plain TF {run['final_test_accuracy_mean']:.4f} "
          f"({run['head_optimizer']})   central L(psi), best epoch "
          f"{own['best_test_accuracy_mean']:.4f} (epoch {own['best_epoch']})   "
          f"central 10-way MLP {bound['test_accuracy_mean']:.4f}")
  print(f"  wrote {_OUTPUT_DIR.value}/crosscheck.json, crosscheck.png")


if __name__ == "__main__":
  cli.run_main(main, check=check)
