"""Exported artifacts, reloaded in a fresh process WITHOUT tff_pflego, reproduce its numbers."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import numpy as np
import tensorflow as tf

from tests.helpers import ENV, REPO
from tff_pflego import experiment
from tff_pflego.algorithms.registry import build_algorithm
from tff_pflego.models import assign_weights
from tff_pflego.models import heads as heads_lib
from tff_pflego.training import driver

# Runs in a fresh interpreter; it must not import (or be able to import) tff_pflego.
RELOAD = r'''
import collections, json, os, sys
sys.path = [p for p in sys.path if os.path.abspath(p) != os.environ["REPO"]]
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

export_dir, inputs_path, out_path = sys.argv[1:]
inputs = np.load(inputs_path)
x = inputs["x"]
client = int(inputs["client"])
out = {}
out["body_savedmodel"] = tf.saved_model.load(os.path.join(export_dir, "body_savedmodel")
    ).signatures["serving_default"](x=tf.constant(x))["features"].numpy()
out["body_keras"] = tf.keras.models.load_model(os.path.join(export_dir, "body.keras"))(x).numpy()
served = tf.saved_model.load(os.path.join(export_dir, "personalized_savedmodel"))
predicted = served.signatures["predict_client"](x=tf.constant(x), client_index=tf.constant(client))
out["client_logits"] = predicted["logits"].numpy()
out["client_class_id"] = predicted["class_id"].numpy()
table = json.load(open(os.path.join(export_dir, "heads.json")))
client_id = [cid for cid, v in table.items() if v["index"] == client][0]
heads = np.load(os.path.join(export_dir, "heads.npz"))
out["head_logits"] = served.signatures["predict_with_head"](
    x=tf.constant(x), kernel=tf.constant(heads[client_id + "/kernel"]),
    bias=tf.constant(heads[client_id + "/bias"]))["logits"].numpy()

def load(name):
  proto = computation_pb2.Computation()
  proto.ParseFromString(open(os.path.join(export_dir, "tff", name + ".pb"), "rb").read())
  return tff.framework.deserialize_computation(proto)
initialize, next_fn = load("initialize"), load("next")
tff.backends.native.set_sync_local_cpp_execution_context()
state = initialize()
datasets, states = [], []
for j in range(int(inputs["num_round_clients"])):
  datasets.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
      x=inputs[f"rx{j}"], y=inputs[f"ry{j}"])).batch(16))
  states.append(collections.OrderedDict(
      client_index=np.int32(inputs[f"index{j}"]), num_classes=np.int32(inputs[f"k{j}"]),
      head=collections.OrderedDict(kernel=inputs[f"kernel{j}"], bias=inputs[f"bias{j}"])))
state, new_states, metrics = next_fn(state, datasets, states)
for i, w in enumerate(state["model"]["trainable"]):
  out[f"next_body{i}"] = np.asarray(w)
out["imported_tff_pflego"] = np.array(any(m.startswith("tff_pflego") for m in sys.modules))
np.savez(out_path, **out)
'''


def test_exported_artifacts_reproduce_the_run_in_a_fresh_process(data_dir, tmp_path):
  out, export_dir = str(tmp_path / "run"), str(tmp_path / "export")
  experiment.run_experiment(experiment.ExperimentConfig(
      dataset="fashion_mnist", num_clients=5, clients_per_round=3, rounds=2,
      local_steps=3, output_dir=out, data_dir=data_dir, progress=False,
      export_dir=export_dir))
  exported = json.load(open(os.path.join(export_dir, "export.json")))
  assert exported["round"] == 2

  # The package's own numbers, from the run's last checkpoint.
  config = experiment.ExperimentConfig(**{
      k: v for k, v in json.load(open(os.path.join(out, "config.json"))).items()
      if k != "workers"})
  prepared = experiment.prepare(config)
  algorithm = build_algorithm(config.algorithm, prepared.algorithm_config)
  run = driver.checkpoint_manager(algorithm, prepared.data, out,
                                  prepared.fingerprint).load_latest()
  client = sorted(run.client_states)[0]
  k = int(prepared.data.num_classes[client])
  x, _ = prepared.data.client_arrays(client, "test")
  x = x[:32]
  body = algorithm.body_fn()
  assign_weights(body, algorithm.body_weights(run.server_state))
  features = body(x).numpy()
  head = run.client_states[client]["head"]
  logits = heads_lib.head_logits(features, head["kernel"][:, :k], head["bias"][:k]).numpy()

  round_clients = sorted(run.client_states)[:2]
  inputs = dict(x=x, client=client, num_round_clients=len(round_clients))
  datasets, states = [], []
  for j, i in enumerate(round_clients):
    rx, ry = prepared.data.client_arrays(i, "train")
    state = run.client_states[i]
    inputs.update({f"rx{j}": rx[:40], f"ry{j}": ry[:40], f"index{j}": i,
                   f"k{j}": prepared.data.num_classes[i],
                   f"kernel{j}": state["head"]["kernel"], f"bias{j}": state["head"]["bias"]})
    datasets.append(tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=rx[:40], y=ry[:40])).batch(16))
    states.append(state)
  new_state, _, _ = algorithm.process.next(algorithm.process.initialize(), datasets, states)
  np.savez(tmp_path / "inputs.npz", **inputs)

  script = tmp_path / "reload.py"
  script.write_text(RELOAD)
  env = dict(ENV, REPO=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env.pop("PYTHONPATH")
  log = tmp_path / "reload.log"
  with open(log, "w") as log_file:  # not a pipe: TFF's worker would hold it open
    proc = subprocess.Popen([sys.executable, str(script), export_dir,
                             str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
                            env=env, cwd=str(tmp_path), start_new_session=True,
                            stdout=log_file, stderr=subprocess.STDOUT)
    try:
      proc.wait(timeout=300)
    finally:  # TFF's default context leaves its worker behind: stop the whole group
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  assert proc.returncode == 0, log.read_text()[-3000:]
  got = np.load(tmp_path / "out.npz")
  assert not got["imported_tff_pflego"]

  np.testing.assert_allclose(got["body_savedmodel"], features, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["body_keras"], features, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got["head_logits"], logits, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(got["client_logits"][:, :k], logits, rtol=1e-5, atol=1e-4)
  assert np.all(got["client_logits"][:, k:] == heads_lib.MASKED_LOGIT)
  np.testing.assert_array_equal(
      got["client_class_id"],
      prepared.data.partition.class_sets[client][np.argmax(logits, -1)])
  for i, w in enumerate(new_state.model.trainable):
    np.testing.assert_allclose(got[f"next_body{i}"], w, rtol=1e-5, atol=1e-6)

  # The same export from the command line (binaries/export.py, a fresh process through
  # cli.run_main): the same heads and the same body, value for value.
  binary_dir = str(tmp_path / "export_binary")
  done = subprocess.run([sys.executable, os.path.join(REPO, "binaries", "export.py"),
                         f"--output_dir={out}", f"--export_dir={binary_dir}"],
                        env=ENV, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  want, got_binary = (np.load(os.path.join(d, "heads.npz"))
                      for d in (export_dir, binary_dir))
  assert sorted(want.files) == sorted(got_binary.files) and want.files
  for key in want.files:
    np.testing.assert_array_equal(got_binary[key], want[key], err_msg=key)
  from_binary = tf.keras.models.load_model(os.path.join(binary_dir, "body.keras"))
  np.testing.assert_allclose(from_binary(x).numpy(), features, rtol=1e-5, atol=1e-5)
