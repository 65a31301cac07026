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
2. an upper bound: the same MLP trained centrally on all training examples (10-way,
   minibatch Adam), each client then scored with the logits of its own classes only.

Writes crosscheck.json and crosscheck.png (all-client mean test accuracy per round).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

import csv
import json

from absl import flags
import numpy as np
import tqdm

from tff_pflego import cli

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


def _prepared(seed: int):
  """The resolved settings and prepared data of `train.py` for these flags and seed."""
  from tff_pflego import experiment
  config = experiment.ExperimentConfig(
      dataset=_DATASET.value, personalization=_PERSONALIZATION.value, seed=seed,
      rounds=_ROUNDS.value, output_dir=os.path.join(_OUTPUT_DIR.value, "unused"))
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  c = experiment.resolve(config)
  return c, experiment.prepare(c)


def independent_pflego(seed: int) -> dict:
  """Algorithm 1 in plain TF, clients one by one; all-client evaluation per round."""
  import tensorflow as tf
  from tff_pflego.models import build_body
  from tff_pflego.algorithms import common

  c, p = _prepared(seed)
  data, sampler, a = p.data, p.sampler, p.algorithm_config
  clients = _client_data(data)
  body = build_body(a.body, a.image_shape, a.seed)
  theta = body.trainable_variables
  heads = [common.initial_client_state(i, int(data.num_classes[i]), body.output_shape[-1],
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
    lr, value = tf.constant(c.client_lr), loss(phi @ w + b, y, k)
    for _ in tf.range(c.local_steps - 1):  # head-only steps, no body pass
      with tf.GradientTape() as tape:
        tape.watch([w, b])
        current = loss(phi @ w + b, y, k)
      gw, gb = tape.gradient(current, [w, b])
      new_w, new_b = w - lr * gw, b - lr * gb
      new_value = loss(phi @ new_w + new_b, y, k)
      if _HEAD_OPTIMIZER.value == "gd" or new_value <= current:
        w, b, value = new_w, new_b, new_value
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


def central_upper_bound(seed: int) -> dict:
  """The MLP trained centrally (10-way); each client scored on its own classes."""
  import tensorflow as tf
  from tff_pflego.models import build_body

  data = _prepared(seed)[1].data
  tf.keras.utils.set_random_seed(seed)
  classes = data.partition.class_sets
  xs, ys = zip(*[data.client_arrays(i, "train") for i in range(data.num_clients)])
  global_y = np.concatenate([classes[i][y] for i, y in enumerate(ys)])
  model = tf.keras.Sequential([
      build_body(data.spec.body, data.spec.image_shape, seed),
      tf.keras.layers.Dense(data.spec.num_classes)])
  model.compile(tf.keras.optimizers.Adam(1e-3),
                tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(np.concatenate(xs), global_y, batch_size=128, epochs=_CENTRAL_EPOCHS.value,
            verbose=0, shuffle=True)
  accs = []
  for i in range(data.num_clients):
    x, y = data.client_arrays(i, "test")
    logits = model.predict(x, verbose=0)[:, classes[i]]
    accs.append(float(np.mean(np.argmax(logits, -1) == y)))
  return dict(seed=seed, epochs=_CENTRAL_EPOCHS.value,
              test_accuracy_mean=float(np.mean(accs)))


def tff_curve(run_dir: str) -> tuple[list, float]:
  with open(os.path.join(run_dir, "metrics.csv")) as f:
    rows = [r for r in csv.DictReader(f) if int(r["round"]) > 0]
  with open(os.path.join(run_dir, "summary.json")) as f:
    final = json.load(f)["final"]["test_accuracy_mean"]
  return [(int(r["round"]), float(r["test_accuracy_mean"])) for r in rows], final


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5), constrained_layout=True)
  if "tff" in results:
    rounds, accs = zip(*results["tff"]["curve"])
    ax.plot(rounds, 100 * np.array(accs), lw=2.5, color="tab:blue", label="TFF process")
  for color, run in enumerate(results["independent"], 1):
    rounds, accs = zip(*run["curve"])
    ax.plot(rounds, 100 * np.array(accs), lw=1.2, ls="--", color=f"C{color}",
            label=f"plain TF, seed {run['seed']} ({run['head_optimizer']})")
  for bound in results["central"]:
    ax.axhline(100 * bound["test_accuracy_mean"], color="gray", ls=":",
               label=f"central MLP, seed {bound['seed']}")
  ax.set(xlabel="round", ylabel="mean test accuracy over all clients (%)", ylim=(90, 100),
         title=f"PFLEGO {_DATASET.value} {_PERSONALIZATION.value}: TFF vs plain TF")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  results = {}
  if _TFF_RUN.value:
    curve, final = tff_curve(_TFF_RUN.value)
    results["tff"] = dict(run=_TFF_RUN.value, curve=curve, final_test_accuracy_mean=final)
  seeds = [int(s) for s in _PARTITION_SEEDS.value]
  results["independent"] = [independent_pflego(s) for s in seeds]
  results["central"] = [central_upper_bound(s) for s in seeds]
  with open(os.path.join(_OUTPUT_DIR.value, "crosscheck.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(os.path.join(_OUTPUT_DIR.value, "crosscheck.png"), results)
  print("\nall-client mean test accuracy, mean of the last 10 evaluations:")
  if "tff" in results:
    print(f"  TFF process ({_TFF_RUN.value}): {results['tff']['final_test_accuracy_mean']:.4f}")
  for run, bound in zip(results["independent"], results["central"]):
    print(f"  seed {run['seed']}: plain TF {run['final_test_accuracy_mean']:.4f} "
          f"({run['head_optimizer']})   central MLP upper bound "
          f"{bound['test_accuracy_mean']:.4f}")
  print(f"  wrote {_OUTPUT_DIR.value}/crosscheck.json, crosscheck.png")


if __name__ == "__main__":
  cli.run_main(main)
