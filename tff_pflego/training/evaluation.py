"""Evaluation of personalized models (current body + each client's own head; Ditto:
each client's own body and head).

`build_personalized_evaluation` is a federated computation: from the body weights
@SERVER, client ids and client states @CLIENTS, each client builds its own train and
test datasets, runs the body forward once per part and reports its loss, accuracy and
example counts together with its `client_index`.

`summarize` turns the per-client results into the reported numbers:
  test_accuracy_mean    (1/I) sum_i acc_i              (the paper's "average over clients")
  test_accuracy_pooled  sum_i n_i acc_i / sum_i n_i    (example-weighted)
  test_accuracy_std     std over clients
  test_accuracy_worst10 mean of the worst ceil(I/10) clients
  train_loss            L(psi) = sum_i alpha_i l_i     (eq. 1)
"""

from __future__ import annotations

import collections
import math
from typing import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms import common
from tff_pflego.models import heads


def build_personalized_evaluation(body_fn: common.BodyFn, types: common.ModelTypes,
                                  train_dataset_computation: tff.Computation,
                                  test_dataset_computation: tff.Computation
                                  ) -> tff.Computation:
  """(weights@SERVER, ids@CLIENTS, client_states@CLIENTS) -> per-client metrics@CLIENTS.

  Each client reads its train and test data inside its own computation
  (`composition.with_client_data` says why).
  """
  id_type = train_dataset_computation.type_signature.parameter

  @tff.tensorflow.computation(types.weights, id_type, types.client_state)
  def evaluate_client(weights, client_id, client_state):
    train_data = train_dataset_computation(client_id)
    test_data = test_dataset_computation(client_id)
    body = body_fn()

    @tf.function
    def evaluate(weights, train_data, test_data, client_state):
      common.assign_weights(body, weights)
      if "body" in client_state:  # Ditto: the client's own body
        for variable, value in zip(body.trainable_variables, client_state["body"]):
          variable.assign(value)
      mask = heads.class_mask(client_state["num_classes"], types.max_classes)
      results = collections.OrderedDict(client_index=client_state["client_index"])
      for part, data in (("train", train_data), ("test", test_data)):
        (results[f"{part}_loss"], results[f"{part}_accuracy"],
         results[f"num_{part}"]) = common.score_on_dataset(body, data, client_state["head"],
                                                           mask)
      return results

    return evaluate(weights, train_data, test_data, client_state)

  @tff.federated_computation(tff.FederatedType(types.weights, tff.SERVER),
                             tff.FederatedType(id_type, tff.CLIENTS),
                             tff.FederatedType(types.client_state, tff.CLIENTS))
  def evaluate_clients(weights, client_ids, client_states):
    return tff.federated_map(evaluate_client, (tff.federated_broadcast(weights),
                                               client_ids, client_states))

  return evaluate_clients


def per_client_table(results: Sequence[dict]) -> dict[str, np.ndarray]:
  """Per-client results as arrays, sorted by client index."""
  results = sorted(results, key=lambda r: int(r["client_index"]))
  return {key: np.array([r[key] for r in results]) for key in results[0]}


def summarize(table: dict[str, np.ndarray]) -> collections.OrderedDict:
  """The aggregate numbers of the module docstring, accuracies as fractions."""
  accuracy = table["test_accuracy"].astype(np.float64)
  num_train = table["num_train"].astype(np.float64)
  num_test = table["num_test"].astype(np.float64)
  worst = np.sort(accuracy)[:max(1, math.ceil(len(accuracy) / 10))]
  return collections.OrderedDict(
      train_loss=float(np.sum(num_train * table["train_loss"]) / num_train.sum()),
      train_accuracy_mean=float(np.mean(table["train_accuracy"])),
      test_loss_mean=float(np.mean(table["test_loss"])),
      test_accuracy_mean=float(accuracy.mean()),
      test_accuracy_pooled=float(np.sum(num_test * accuracy) / num_test.sum()),
      test_accuracy_std=float(accuracy.std()),
      test_accuracy_worst10=float(worst.mean()),
  )


def pooled_test_accuracy(table: dict[str, np.ndarray]) -> float:
  """Accuracy pooled over the clients' test examples (the reference code's protocol)."""
  n = table["num_test"].astype(np.float64)
  return float(np.sum(n * table["test_accuracy"]) / n.sum())
