"""Small synthetic problems and a plain-Keras central reference for PFLEGO."""

from __future__ import annotations

import collections
import dataclasses
import functools
import gzip
import importlib
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil
import tensorflow as tf

from tff_pflego import settings
from tff_pflego.config import LOCAL_MOMENTUM
from tff_pflego.algorithms import pflego
from tff_pflego.algorithms.model_types import initial_client_state
from tff_pflego.models import build_body

# Running the binaries -------------------------------------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [sys.executable, os.path.join(REPO, "binaries", "train.py")]
# What TensorFlow puts in its own process's environment when it loads: a binary started
# from a shell has none of it, so neither does one started by a test (TF2_BEHAVIOR hid
# a start-up defect of every binary that builds a Keras body, tff_pflego/cli.py).
SET_BY_TENSORFLOW = ("TF2_BEHAVIOR", "TPU_ML_PLATFORM", "KMP_DUPLICATE_LIB_OK",
                     "KMP_INIT_AT_FORK")
# The binaries' temporary files go to a directory of this test process's own, removed
# when its session ends (tests/conftest.py): TensorFlow's AutoGraph writes a file per
# converted function and removes it at exit, which a child killed by a test never reaches.
CHILDREN_TMPDIR = tempfile.mkdtemp(prefix="tff_pflego_test_children_")
ENV = {k: v for k, v in os.environ.items() if k not in SET_BY_TENSORFLOW} | dict(
    PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=CHILDREN_TMPDIR)
# Per-round CSV columns that measure time: they differ between equal runs.
TIMING_COLUMNS = {"wall_time_s", "round_time_s", "client_time_s", "client_compute_s",
                  "client_time_max_s", "server_time_s"}


def run_recording_tensorflow(binary: str, args: list[str]) -> subprocess.CompletedProcess:
  """Runs binaries/`binary` with `args`; its last stdout line is "exit <code> <the
  TensorFlow modules loaded>" (code None: main returned)."""
  code = ("import runpy, sys\n"
          "sys.argv = sys.argv[1:]\n"
          "try:\n"
          "  runpy.run_path(sys.argv[0], run_name='__main__')\n"
          "except SystemExit as e:\n"
          "  print('exit', e.code, sorted(m for m in ('tensorflow', 'tensorflow_datasets',\n"
          "        'tensorflow_federated') if m in sys.modules))\n")
  return subprocess.run([sys.executable, "-c", code, os.path.join(REPO, "binaries", binary),
                         *args], env=ENV, capture_output=True, text=True, timeout=120)


def tiny_run(data_dir, output_dir, rounds=2):
  return TRAIN + ["--dataset=fashion_mnist", "--num_clients=5", "--clients_per_round=2",
                  f"--rounds={rounds}", "--local_steps=2", f"--data_dir={data_dir}",
                  f"--output_dir={output_dir}", "--noprogress"]


def claim_in_another_process(run_dir: str) -> subprocess.Popen:
  """A live process holding `run_dir`'s claim (`records.claim`) until killed."""
  proc = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\n"
       "from tff_pflego import records\n"
       "with records.claim(sys.argv[1]) as mine:\n"
       "  print(mine, flush=True)\n"
       "  time.sleep(300)\n", run_dir],
      env=ENV, stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "True"
  return proc


def workers_of(pid: int) -> list[psutil.Process]:
  try:
    return [c for c in psutil.Process(pid).children(recursive=True)
            if c.name() == "worker_binary"]
  except psutil.NoSuchProcess:
    return []


def wait_for_worker(proc: subprocess.Popen, timeout: float = 120) -> psutil.Process:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, proc.communicate()
    found = workers_of(proc.pid)
    if found:
      return found[0]
    time.sleep(0.2)
  raise AssertionError("the binary never started a TFF worker")


def assert_gone(worker: psutil.Process, timeout: float = 10) -> None:
  try:
    worker.wait(timeout)
  except psutil.NoSuchProcess:
    pass
  assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE


# PFLEGO on the small synthetic problem -----------------------------------------------

SIZES = (5, 8, 11)
NUM_CLASSES = (2, 3, 3)  # K_i differ: heads padded to 3 and masked
MAX_CLASSES = 3
BETA, RHO = 0.3, 0.2


def pflego_process(num_clients_total, participation_prob, local_steps, optimizer="sgd",
          total_examples=None, head_step="exact"):
  return pflego.build_pflego_process(
      body_fn, image_shape=IMAGE_SHAPE, max_classes=MAX_CLASSES,
      total_examples=total_examples, participation_prob=participation_prob,
      local_steps=local_steps, client_lr=BETA, server_lr=RHO,
      server_optimizer=optimizer, head_step=head_step, head_optimizer="gd")


def subset_estimate(process, state, data, states, subset):
  new_state, new_states, _ = process.next(
      state, [as_dataset(*data[i]) for i in subset], [states[i] for i in subset])
  theta = [np.asarray(w) for w in state.model.trainable]
  estimate = [(w - np.asarray(n)) / RHO for w, n in zip(theta, new_state.model.trainable)]
  return estimate, {int(s["client_index"]): s["head"] for s in new_states}


IMAGE_SHAPE = (4, 4, 1)
body_fn = functools.partial(build_body, "mlp", IMAGE_SHAPE, 3)


def algorithm_config(**overrides):
  """An AlgorithmConfig of the synthetic problems: the settings' defaults, paper-style
  values for the ones derived at run time, then `overrides`."""
  values = dict(body="mlp", image_shape=IMAGE_SHAPE, max_classes=3, total_examples=10,
                participation_prob=1.0, local_steps=2, client_lr=0.1, server_lr=0.1,
                server_optimizer="sgd", prox_mu=0.25, momentum=0.0)
  return settings.algorithm_config(**values | overrides)


def plan(name: str, local_steps: int, client_lr: float, **overrides):
  """The AveragingPlan of baseline `name` (its module's `plan`), with its default
  local momentum unless `overrides` say otherwise."""
  module = importlib.import_module(f"tff_pflego.algorithms.{name}")
  overrides = dict(momentum=LOCAL_MOMENTUM.get(name, 0.0)) | overrides
  return module.plan(algorithm_config(local_steps=local_steps, client_lr=client_lr,
                                      **overrides))


def synthetic_clients(sizes, num_classes, seed=0):
  """Per client: (x, y) numpy arrays with labels in 0..K_i-1."""
  rng = np.random.default_rng(seed)
  return [(rng.random((n,) + IMAGE_SHAPE, np.float32),
           rng.integers(0, k, n).astype(np.int32)) for n, k in zip(sizes, num_classes)]


def as_dataset(x, y, batch_size=4):
  return tf.data.Dataset.from_tensor_slices(
      collections.OrderedDict(x=x, y=y)).batch(batch_size)


def client_states(num_classes, max_classes, seed=0):
  return [initial_client_state(i, k, 200, max_classes, seed)
          for i, k in enumerate(num_classes)]


def keras_model(body_weights, head, num_classes):
  """Body + Dense(K_i) head as ONE plain Keras model, weights copied in."""
  body = body_fn()
  model = tf.keras.Sequential([body, tf.keras.layers.Dense(num_classes)])
  model.build((None,) + IMAGE_SHAPE)
  for v, w in zip(body.trainable_variables, body_weights):
    v.assign(w)
  model.layers[-1].kernel.assign(head["kernel"][:, :num_classes])
  model.layers[-1].bias.assign(head["bias"][:num_classes])
  return model


def loss_fn(model, x, y):
  return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
      y, model(x), from_logits=True))


def head_presteps(body_weights, head, k, x, y, steps, lr):
  """tau-1 head-only GD steps computed by a plain Keras model (recomputing features)."""
  model = keras_model(body_weights, head, k)
  for _ in range(steps):
    with tf.GradientTape() as tape:
      loss = loss_fn(model, x, y)
    grads = tape.gradient(loss, model.layers[-1].trainable_variables)
    for v, g in zip(model.layers[-1].trainable_variables, grads):
      v.assign_sub(lr * g)
  return model


def central_gradients(body_weights, heads, num_classes, data, presteps=0, lr=0.0):
  """Exact grad of L(psi) = sum_i alpha_i l_i over body and every head.

  Returns (grad_body, [grad_head_i], [model_i]); heads first take `presteps` head-only
  GD steps (PFLEGO's tau - 1), so the gradient is taken where PFLEGO takes it.
  """
  total = sum(len(y) for _, y in data)
  models = [head_presteps(body_weights, h, k, x, y, presteps, lr)
            for h, k, (x, y) in zip(heads, num_classes, data)]
  grad_body = [np.zeros_like(w) for w in body_weights]
  grad_heads = []
  for model, (x, y) in zip(models, data):
    alpha = len(y) / total
    with tf.GradientTape() as tape:
      loss = alpha * loss_fn(model, x, y)
    body_vars = model.layers[0].trainable_variables
    head_vars = model.layers[-1].trainable_variables
    g = tape.gradient(loss, body_vars + head_vars)
    grad_body = [a + b.numpy() for a, b in zip(grad_body, g[:len(body_vars)])]
    grad_heads.append([t.numpy() for t in g[len(body_vars):]])
  return grad_body, grad_heads, models


def write_idx_gz(path: str, array: np.ndarray) -> None:
  """Writes `array` as a gzipped IDX (MNIST-format) file of unsigned bytes."""
  header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def register_tiny_dataset(root: str, monkeypatch, num_train: int = 64,
                          num_test: int = 32, num_classes: int = 4, seed: int = 0) -> dict:
  """A small dataset of random IDX images, registered as `tiny` for this test only.

  It goes through the real preparation (the EMNIST-Letters builder, TFDS, client
  files); returns its spec, raw data dir and a fresh data dir under `root`.
  """
  from tff_pflego.data import builders, sources
  raw = os.path.join(root, "raw", "tiny")
  os.makedirs(raw)
  rng = np.random.default_rng(seed)
  for split, n in (("train", num_train), ("test", num_test)):
    images, labels = builders.EmnistLetters.FILES[split]
    write_idx_gz(os.path.join(raw, images), rng.integers(0, 256, (n, 28, 28)))
    write_idx_gz(os.path.join(raw, labels), np.arange(n) % num_classes + 1)  # 1-based
  spec = dataclasses.replace(sources.get_dataset_spec("emnist_letters"), name="tiny",
                             display_name="Tiny", num_classes=num_classes,
                             raw_subdir="tiny", releases={})
  monkeypatch.setitem(sources.DATASETS, "tiny", spec)
  return dict(spec=spec, raw_dir=os.path.dirname(raw), data_dir=os.path.join(root, "data"))
