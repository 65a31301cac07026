"""A personalized cell's central ceiling: PFLEGO's objective L(psi) minimized centrally.

The same model as PFLEGO's (the dataset's body, one K_i-class head per client,
zero-initialized heads) is trained on every client's training examples at once, in
shuffled minibatches of 128, with Adam(1e-3):

  min_psi L(psi) = sum_i alpha_i L_i(theta, W_i),  alpha_i = n_i / n,

whose minibatch estimate over pooled examples is unbiased. First `HEAD_WARMUP_EPOCHS`
epochs train the heads alone on the initial body, as every PFLEGO client fits its head
before its first body gradient; then `epochs` epochs train body and heads together
(each with its own Adam, so the body's moments start with its first gradient). Without
the warm-up, the body's first gradients come through heads near zero, Adam scales them
up to full steps, and the Conv4 body on Omniglot died within 50 steps (every ReLU
feature 0, the accuracy at chance for all 10 epochs). After each joint epoch every
client is scored with its own head; the ceiling is the best epoch's mean test accuracy
over clients. The epoch is chosen by the test accuracy itself, so the figure is an
optimistic bound on what minimizing L(psi) generalizes to on this partition, whatever
the federated optimizer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

import numpy as np

from tff_pflego import files, records
from tff_pflego.errors import UserError

CEILING_FILE = "ceiling.json"
BATCH_SIZE = 128
LEARNING_RATE = 1e-3
HEAD_WARMUP_EPOCHS = 1
# What a ceiling.json must record to count: computed by this recipe.
RECIPE = dict(batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE,
              head_warmup_epochs=HEAD_WARMUP_EPOCHS)


def pooled(data, part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """All clients' examples of `part`: images, local labels, client ids."""
  xs, ys = zip(*[data.client_arrays(i, part) for i in range(data.num_clients)])
  ids = np.concatenate([np.full(len(y), i) for i, y in enumerate(ys)])
  return np.concatenate(xs), np.concatenate(ys), ids


def client_mean_accuracy(correct: np.ndarray, ids: np.ndarray, num_clients: int) -> float:
  return float(np.mean([correct[ids == i].mean() for i in range(num_clients)]))


@dataclasses.dataclass
class CentralFit:
  """The centrally trained model: body, heads [I, M, K_max] and biases [I, K_max]
  (tf.Variables), and the mean test accuracy over clients after each joint epoch."""
  body: Any
  heads: Any
  biases: Any
  curve: list[float]


def fit_central(data, seed: int, epochs: int, progress: bool = True) -> CentralFit:
  """Minimizes L(psi) centrally on `data`'s partition (see the module docstring)."""
  import tensorflow as tf
  import tqdm
  from tff_pflego.models import build_body

  body = build_body(data.spec.body, data.spec.image_shape, seed)
  num_clients, k = data.num_clients, int(data.num_classes.max())
  heads = tf.Variable(tf.zeros([num_clients, body.output_shape[-1], k]))
  biases = tf.Variable(tf.zeros([num_clients, k]))
  sizes = tf.constant(data.num_classes, tf.int32)
  head_variables = [heads, biases]
  head_adam = tf.keras.optimizers.Adam(LEARNING_RATE)
  body_adam = tf.keras.optimizers.Adam(LEARNING_RATE)

  def logits(x, ids):
    raw = tf.einsum("nm,nmk->nk", body(x), tf.gather(heads, ids)) + tf.gather(biases, ids)
    return tf.where(tf.range(k)[None] < tf.gather(sizes, ids)[:, None], raw, -1e9)

  def step_fn(train_body: bool):
    @tf.function
    def step(x, y, ids):
      variables = head_variables + (body.trainable_variables if train_body else [])
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits(x, ids)))
      gradients = tape.gradient(loss, variables)
      head_adam.apply_gradients(zip(gradients[:2], head_variables))
      if train_body:
        body_adam.apply_gradients(zip(gradients[2:], body.trainable_variables))
    return step

  predict = tf.function(lambda x, ids: tf.argmax(logits(x, ids), -1, output_type=tf.int32))
  (x, y, ids), test = pooled(data, "train"), pooled(data, "test")
  rng, curve = np.random.default_rng(seed), []
  steps = [step_fn(train_body=False)] * HEAD_WARMUP_EPOCHS + [step_fn(True)] * epochs
  for epoch in tqdm.trange(len(steps), desc=f"central L(psi), seed {seed}", unit="epoch",
                           dynamic_ncols=True, disable=not progress):
    order = rng.permutation(len(y))
    for start in range(0, len(order), BATCH_SIZE):
      batch = order[start:start + BATCH_SIZE]
      steps[epoch](x[batch], y[batch], ids[batch])
    if epoch >= HEAD_WARMUP_EPOCHS:
      correct = np.concatenate([predict(test[0][s:s + 2000], test[2][s:s + 2000]).numpy()
                                for s in range(0, len(test[1]), 2000)]) == test[1]
      curve.append(client_mean_accuracy(correct, test[2], num_clients))
  return CentralFit(body, heads, biases, curve)


def central_objective_ceiling(data, seed: int, epochs: int, progress: bool = True) -> dict:
  """L(psi) trained centrally on `data`'s partition: the accuracy of each epoch."""
  curve = fit_central(data, seed, epochs, progress).curve
  return dict(seed=seed, epochs=epochs, **RECIPE, curve=curve,
              best_test_accuracy_mean=max(curve), best_epoch=int(np.argmax(curve)) + 1)


def read_ceiling(run_dir: str) -> Optional[dict]:
  """The run's ceiling if one was computed on the run's own partition, else None."""
  path = os.path.join(run_dir, CEILING_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    ceiling = json.load(f)
  if ceiling.get("partition_fingerprint") != records.partition_fingerprint(run_dir):
    return None  # computed on another partition: stale
  if any(ceiling.get(name) != value for name, value in RECIPE.items()):
    return None  # computed by another recipe: stale
  return ceiling


def write_ceiling(run_dir: str, data, seed: int, epochs: int,
                  progress: bool = True) -> dict:
  """Computes the ceiling of the run in `run_dir` on `data`, which must hold the run's
  partition (its partition.json fingerprint), and writes it as ceiling.json."""
  wanted = records.partition_fingerprint(run_dir)
  if data.provenance["partition_fingerprint"] != wanted:
    raise UserError(f"{run_dir}: the prepared data hold partition "
                    f"{data.provenance['partition_fingerprint'][:12]}, the run "
                    f"{wanted[:12]}; no ceiling computed on another partition")
  ceiling = central_objective_ceiling(data, seed, epochs, progress)
  ceiling["partition_fingerprint"] = wanted
  files.write_json(os.path.join(run_dir, CEILING_FILE), ceiling)
  return ceiling
