"""Exports a trained run for TF systems that do not have this package.

From the newest checkpoint of a run (`export_run`), into `export_dir`:

  body_savedmodel/        the body phi(x; theta) as a TF SavedModel; signature
                          `serving_default(x: float32[n, H, W, C]) -> {features}`
  body.keras              the same body as a Keras model (`tf.keras.models.load_model`)
  heads.npz               every visited client's head, unpadded: `<client_id>/kernel`
                          float32[M, K_i] and `<client_id>/bias` float32[K_i]
  heads.json              client_id -> {index, classes}: the dataset's class id of each
                          local label 0..K_i-1
  personalized_savedmodel/  body + every client's head (padded to K_max) as one
                          SavedModel with two signatures:
                          `predict_client(x, client_index)` -> {logits [n, K_max],
                             absent classes at -1e9; local_label; class_id}
                          `predict_with_head(x, kernel, bias)` -> {logits [n, K]}
                          (any head, e.g. one loaded from heads.npz)
  tff/initialize.pb, tff/next.pb   the algorithm's TFF computations, serialized
                          (`tff.framework.serialize_computation`); load them with
                          `tff.framework.deserialize_computation` and run them in any
                          TFF runtime: next(state, client datasets, client states)
  tff/signatures.txt      their type signatures
  export.json             what was exported, from which run and round
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego import files
from tff_pflego.algorithms.api import PersonalizedAlgorithm
from tff_pflego.models import assign_weights
from tff_pflego.data.federated import FederatedData
from tff_pflego.errors import UserError
from tff_pflego.models import heads as heads_lib
from tff_pflego.training.checkpoints import RunState


class _Personalized(tf.Module):
  """Body + all clients' padded heads, for serving a given client or a given head."""

  def __init__(self, body: tf.keras.Model, kernels: np.ndarray, biases: np.ndarray,
               num_classes: np.ndarray, class_ids: np.ndarray, image_shape: tuple):
    super().__init__()
    self.body = body
    self.kernels = tf.Variable(kernels, trainable=False, name="head_kernels")
    self.biases = tf.Variable(biases, trainable=False, name="head_biases")
    self.num_classes = tf.constant(num_classes, tf.int32)
    self.class_ids = tf.constant(class_ids, tf.int32)  # [I, K_max], -1 when absent
    max_classes = kernels.shape[-1]
    x_spec = tf.TensorSpec((None,) + tuple(image_shape), tf.float32, name="x")

    @tf.function(input_signature=[x_spec, tf.TensorSpec((), tf.int32, "client_index")])
    def predict_client(x, client_index):
      features = self.body(x, training=False)
      mask = heads_lib.class_mask(tf.gather(self.num_classes, client_index), max_classes)
      logits = heads_lib.head_logits(features, tf.gather(self.kernels, client_index),
                                     tf.gather(self.biases, client_index), mask)
      local = tf.argmax(logits, -1, output_type=tf.int32)
      return {"logits": logits, "local_label": local,
              "class_id": tf.gather(tf.gather(self.class_ids, client_index), local)}

    @tf.function(input_signature=[x_spec,
                                  tf.TensorSpec((None, None), tf.float32, "kernel"),
                                  tf.TensorSpec((None,), tf.float32, "bias")])
    def predict_with_head(x, kernel, bias):
      return {"logits": heads_lib.head_logits(self.body(x, training=False), kernel, bias)}

    self.predict_client = predict_client
    self.predict_with_head = predict_with_head


class _Body(tf.Module):

  def __init__(self, body: tf.keras.Model, image_shape: tuple):
    super().__init__()
    self.body = body

    @tf.function(input_signature=[
        tf.TensorSpec((None,) + tuple(image_shape), tf.float32, name="x")])
    def serve(x):
      return {"features": self.body(x, training=False)}

    self.serve = serve


def export_run(export_dir: str, algorithm: PersonalizedAlgorithm, run: RunState,
               data: FederatedData, source: dict[str, Any]) -> dict[str, str]:
  """Writes the artifacts of the module docstring; returns {artifact: path}."""
  if algorithm.personal_body:
    raise UserError(f"export of {algorithm.name}'s personal models (a body per client) "
                    "is not supported yet")
  os.makedirs(export_dir, exist_ok=True)
  paths = {name: os.path.join(export_dir, name) for name in (
      "body_savedmodel", "body.keras", "heads.npz", "heads.json",
      "personalized_savedmodel", "tff", "export.json")}
  image_shape = data.spec.image_shape
  body = algorithm.body_fn()
  assign_weights(body, algorithm.body_weights(run.server_state))

  body_module = _Body(body, image_shape)
  tf.saved_model.save(body_module, paths["body_savedmodel"],
                      signatures={"serving_default": body_module.serve})
  body.save(paths["body.keras"])

  visited = sorted(run.client_states)  # heads as evaluated (FedAvg: the shared one)
  states = dict(zip(visited, algorithm.evaluation_states(
      run.server_state, [run.client_states[i] for i in visited])))
  max_classes = algorithm.types.max_classes
  kernels = np.zeros((data.num_clients, algorithm.types.feature_dim, max_classes),
                     np.float32)
  biases = np.zeros((data.num_clients, max_classes), np.float32)
  class_ids = -np.ones((data.num_clients, max_classes), np.int32)
  arrays, table = {}, {}
  for i, client_id in enumerate(data.client_ids):
    k = int(data.num_classes[i])
    class_ids[i, :k] = data.partition.class_sets[i]
    table[client_id] = dict(index=i, classes=data.partition.class_sets[i].tolist(),
                            trained=i in states)
    if i not in states:
      continue  # never sampled: no head worth serving
    head = states[i]["head"]
    kernels[i], biases[i] = head["kernel"], head["bias"]
    arrays[f"{client_id}/kernel"] = np.asarray(head["kernel"])[:, :k]
    arrays[f"{client_id}/bias"] = np.asarray(head["bias"])[:k]
  np.savez(paths["heads.npz"], **arrays)
  files.write_json(paths["heads.json"], table)

  personalized = _Personalized(body, kernels, biases, data.num_classes.astype(np.int32),
                               class_ids, image_shape)
  tf.saved_model.save(personalized, paths["personalized_savedmodel"], signatures={
      "predict_client": personalized.predict_client,
      "predict_with_head": personalized.predict_with_head})

  os.makedirs(paths["tff"], exist_ok=True)
  signatures = []
  for name in ("initialize", "next"):
    computation = getattr(algorithm.process, name)
    proto = tff.framework.serialize_computation(computation)
    with open(os.path.join(paths["tff"], f"{name}.pb"), "wb") as f:
      f.write(proto.SerializeToString())
    signatures.append(f"{name}: {computation.type_signature}")
  with open(os.path.join(paths["tff"], "signatures.txt"), "w") as f:
    f.write("\n\n".join(signatures) + "\n")

  files.write_json(paths["export.json"], collections.OrderedDict(
      source=source, round=run.round_num, algorithm=algorithm.name,
      image_shape=list(image_shape), feature_dim=algorithm.types.feature_dim,
      max_classes=max_classes, clients_with_heads=len(arrays) // 2,
      artifacts={k: os.path.basename(v) for k, v in paths.items()}))
  return paths
