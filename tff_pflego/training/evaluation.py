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

With a `HeadRefit` (the protocol a deployed client would see), every client first
refits its head on the current body: W_i' = tau - 1 head-only steps from W_i on its
cached train features (`pflego.head_gradient_steps`, the steps PFLEGO's clients take),
then scores with W_i':
  test_accuracy_refit_mean, test_accuracy_refit_pooled   as above, with W_i'
  train_loss_refit      sum_i alpha_i l_i(W_i', theta)  (<= L(psi) with monotone_gd)
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms.model_types import BodyFn, ModelTypes
from tff_pflego.algorithms.pflego import head_gradient_steps
from tff_pflego.data.batching import full_batch
from tff_pflego.models import assign_weights
from tff_pflego.models import heads

# A vector of client files -> their examples, one file after another, in TF.
FilesFn = Callable[[tf.Tensor], tf.data.Dataset]
PARTS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class HeadRefit:
  """The head-only steps a client takes on the current body before it is scored
  (module docstring): `steps` = tau - 1 of rate `learning_rate` (beta), `optimizer` as
  `pflego.head_gradient_steps`."""
  steps: int
  learning_rate: float
  optimizer: str

  def refit(self, features: tf.Tensor, labels: tf.Tensor, head, mask: tf.Tensor,
            valid: Optional[tf.Tensor] = None):
    return head_gradient_steps(features, labels, head, mask, self.steps,
                               self.learning_rate, self.optimizer, valid)


REFIT_KEYS = ("refit_train_loss", "refit_test_loss", "refit_test_accuracy")


def _refit_scores(score_part: Callable[[str], tuple]) -> dict:
  """The `REFIT_KEYS` scores from score_part(part) -> (loss, accuracy) of the refitted
  heads on that part."""
  (train_loss, _), (test_loss, test_accuracy) = (score_part(part) for part in PARTS)
  return dict(zip(REFIT_KEYS, (train_loss, test_loss, test_accuracy)))


def build_personalized_evaluation(body_fn: BodyFn, types: ModelTypes,
                                  train_dataset_computation: tff.Computation,
                                  test_dataset_computation: tff.Computation,
                                  personal_body: bool = False,
                                  refit: Optional[HeadRefit] = None) -> tff.Computation:
  """(weights@SERVER, ids@CLIENTS, client_states@CLIENTS) -> per-client metrics@CLIENTS.

  Each client reads its train and test data inside its own computation
  (`composition.with_client_data` says why). With `personal_body` the client states
  hold each client's own body (`PersonalizedAlgorithm.personal_body`), which replaces
  the broadcast body's trainable weights. With `refit`, also the `REFIT_KEYS` scores
  (module docstring).
  """
  id_type = train_dataset_computation.type_signature.parameter

  @tff.tensorflow.computation(types.weights, id_type, types.client_state)
  def evaluate_client(weights, client_id, client_state):
    train_data = train_dataset_computation(client_id)
    test_data = test_dataset_computation(client_id)
    body = body_fn(initialize=False)

    @tf.function
    def evaluate(weights, train_data, test_data, client_state):
      assign_weights(body, weights)
      if personal_body:
        for variable, value in zip(body.trainable_variables, client_state["body"]):
          variable.assign(value)
      mask = heads.class_mask(client_state["num_classes"], types.max_classes)
      results = collections.OrderedDict(client_index=client_state["client_index"])
      parts = {}
      for part, data in (("train", train_data), ("test", test_data)):
        batch = full_batch(data)
        parts[part] = (body(batch["x"], training=False), batch["y"])
        results[f"{part}_loss"], results[f"{part}_accuracy"] = heads.head_loss_and_accuracy(
            *parts[part], client_state["head"]["kernel"], client_state["head"]["bias"],
            mask)
        results[f"num_{part}"] = tf.shape(batch["y"])[0]
      if refit is not None:
        head = refit.refit(*parts["train"], client_state["head"], mask)
        results.update(_refit_scores(lambda part: heads.head_loss_and_accuracy(
            *parts[part], head["kernel"], head["bias"], mask)))
      return results

    return evaluate(weights, train_data, test_data, client_state)

  @tff.federated_computation(tff.FederatedType(types.weights, tff.SERVER),
                             tff.FederatedType(id_type, tff.CLIENTS),
                             tff.FederatedType(types.client_state, tff.CLIENTS))
  def evaluate_clients(weights, client_ids, client_states):
    return tff.federated_map(evaluate_client, (tff.federated_broadcast(weights),
                                               client_ids, client_states))

  return evaluate_clients


# Examples of one part (train or test) a cohort reads at most: bounds the body's
# activations (Conv4 on 28x28: ~200 MB) while clients of a few examples share a call.
COHORT_EXAMPLES = 1024
MAX_COHORT_CLIENTS = 128


def _stacked_type(type_spec: tff.types.Type) -> tff.types.Type:
  """`type_spec` with a leading [None] dimension on every tensor (a cohort's states)."""
  if isinstance(type_spec, tff.TensorType):
    return tff.TensorType(type_spec.dtype, (None,) + tuple(type_spec.shape))
  return tff.types.StructWithPythonType(
      [(name, _stacked_type(t)) for name, t in tff.structure.to_elements(type_spec)],
      type_spec.python_container)


def cohort_type(path_dtype=np.str_, parts: Sequence[str] = PARTS
                ) -> tff.types.StructWithPythonType:
  """What a cohort's clients are given by: their file of each part and its size."""
  return tff.types.StructWithPythonType(
      [(f"{part}_files", tff.TensorType(path_dtype, (None,))) for part in parts]
      + [(f"num_{part}", tff.TensorType(np.int32, (None,))) for part in parts],
      collections.OrderedDict)


def cohort_input(files: dict[str, np.ndarray], num_examples: dict[str, np.ndarray],
                 positions: np.ndarray, parts: Sequence[str] = PARTS
                 ) -> collections.OrderedDict:
  """The `cohort_type` value of the clients at `positions` of `files` / `num_examples`
  (part -> one entry per client)."""
  return collections.OrderedDict(
      [(f"{part}_files", np.asarray(files[part])[positions]) for part in parts]
      + [(f"num_{part}", np.asarray(num_examples[part], np.int32)[positions])
         for part in parts])


def check_parts(parts: Sequence[str], refit: Optional[HeadRefit] = None) -> None:
  """`parts`: one or both of PARTS, in that order; a head refit needs both."""
  if not parts or list(parts) != [p for p in PARTS if p in parts]:
    raise ValueError(f"parts must be one or both of {PARTS}, in that order: {parts}")
  if refit is not None and tuple(parts) != PARTS:
    raise ValueError("a head refit fits on the train part and scores both: parts must "
                     f"be {PARTS}")


def build_cohort_evaluation(body_fn: BodyFn, types: ModelTypes, read_files: FilesFn,
                            path_dtype=np.str_,
                            refit: Optional[HeadRefit] = None,
                            parts: Sequence[str] = PARTS) -> tff.Computation:
  """(weights@SERVER, cohorts@CLIENTS, cohort states@CLIENTS) -> metrics@CLIENTS.

  The same per-client numbers as `build_personalized_evaluation`, with one client
  computation per cohort of clients instead of one per client: the cohort reads its
  clients' files of a part in one pipeline (`read_files`: a TF function from a vector
  of client files to their examples, one file after another; `cohort_type` gives the
  files and each one's number of examples N_c), runs the body once over all of them,
  scores example n with the head of its owner c(n) (the N_c examples after those of
  the clients before c are c's), z_n = phi_n W_{c(n)} + b_{c(n)} (classes >= K_{c(n)}
  masked), and averages loss and accuracy per client. A cohort's states are its
  clients' states stacked along a first axis; the metrics come back the same way. For
  a shared body only (a client state with a personal body needs
  `build_personalized_evaluation`). With `refit`, each client's head is refitted on
  its own train features (the cohort's clients together) and the `REFIT_KEYS` scores
  added. `parts`: the parts scored (the sampled protocol needs only `("test",)`); each
  part's numbers do not depend on the others being scored.
  """
  check_parts(parts, refit)
  states_type = _stacked_type(types.client_state)
  cohorts_type = cohort_type(path_dtype, parts)

  @tff.tensorflow.computation(types.weights, cohorts_type, states_type)
  def evaluate_cohort(weights, cohort, states):
    body = body_fn(initialize=False)

    def score(features, y, sizes, owner, head, num_classes):
      """Per-client mean loss and accuracy, example n scored with head[owner[n]]."""
      num_clients = tf.shape(sizes)[0]
      logits = (tf.einsum("nm,nmk->nk", features, tf.gather(head["kernel"], owner))
                + tf.gather(head["bias"], owner))
      mask = heads.class_mask(tf.gather(num_classes, owner)[:, tf.newaxis],
                              types.max_classes)
      logits = tf.where(mask, logits, tf.constant(heads.MASKED_LOGIT, tf.float32))
      loss = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
      correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y),
                        tf.float32)
      count = tf.cast(sizes, tf.float32)
      return (tf.math.unsorted_segment_sum(loss, owner, num_clients) / count,
              tf.math.unsorted_segment_sum(correct, owner, num_clients) / count)

    @tf.function
    def evaluate(weights, cohort, states):
      assign_weights(body, weights)
      num_clients = tf.shape(states["client_index"])[0]
      results = collections.OrderedDict(client_index=states["client_index"])
      scored = {}
      for part in parts:
        batch = full_batch(read_files(cohort[f"{part}_files"]))
        x, y, sizes = batch["x"], batch["y"], cohort[f"num_{part}"]
        tf.debugging.assert_equal(tf.shape(y)[0], tf.reduce_sum(sizes), message=(
            f"the cohort's {part} files hold another number of examples than recorded"))
        owner = tf.repeat(tf.range(num_clients), sizes)
        scored[part] = (body(x, training=False), y, sizes, owner)
        results[f"{part}_loss"], results[f"{part}_accuracy"] = score(
            *scored[part], states["head"], states["num_classes"])
        results[f"num_{part}"] = sizes
      if refit is not None:
        head = _refit_cohort(refit, *scored["train"], states, types.max_classes)
        results.update(_refit_scores(
            lambda part: score(*scored[part], head, states["num_classes"])))
      return results

    return evaluate(weights, cohort, states)

  @tff.federated_computation(tff.FederatedType(types.weights, tff.SERVER),
                             tff.FederatedType(cohorts_type, tff.CLIENTS),
                             tff.FederatedType(states_type, tff.CLIENTS))
  def evaluate_cohorts(weights, cohorts, cohort_states):
    return tff.federated_map(evaluate_cohort, (tff.federated_broadcast(weights),
                                               cohorts, cohort_states))

  return evaluate_cohorts


def _refit_cohort(refit: HeadRefit, features: tf.Tensor, labels: tf.Tensor,
                  sizes: tf.Tensor, owner: tf.Tensor, states, max_classes: int):
  """Every cohort client's head refitted on its own rows of `features` (the clients'
  examples one client after another, `sizes` of them each; row n is client owner[n]'s),
  all clients at once: their rows padded to the largest client's ([C, N_max, M]) and
  marked valid."""
  num_clients = tf.shape(sizes)[0]
  position = tf.range(tf.shape(owner)[0]) - tf.gather(tf.cumsum(sizes, exclusive=True),
                                                       owner)
  at = tf.stack([owner, position], axis=1)
  shape = tf.stack([num_clients, tf.reduce_max(sizes)])
  padded = lambda values: tf.scatter_nd(
      at, values, tf.concat([shape, tf.shape(values)[1:]], axis=0))
  return refit.refit(padded(features), padded(labels), states["head"],
                     heads.class_mask(states["num_classes"][:, tf.newaxis], max_classes),
                     valid=padded(tf.ones_like(labels, tf.bool)))


def plan_cohorts(num_examples: np.ndarray) -> list[np.ndarray]:
  """Positions 0..len-1 cut into consecutive cohorts of at most COHORT_EXAMPLES
  examples (a larger client alone) and MAX_COHORT_CLIENTS clients, and at least two
  cohorts when there are two clients, so both cores have work."""
  limit = max(1, min(MAX_COHORT_CLIENTS, -(-len(num_examples) // 2)))
  cohorts, current, examples = [], [], 0
  for position, n in enumerate(num_examples):
    if current and (examples + n > COHORT_EXAMPLES or len(current) == limit):
      cohorts.append(np.array(current))
      current, examples = [], 0
    current.append(position)
    examples += int(n)
  if current:
    cohorts.append(np.array(current))
  return cohorts


def stack_states(states: Sequence[dict]) -> dict:
  """Client states stacked along a first axis (a cohort's states)."""
  return tf.nest.map_structure(lambda *leaves: np.stack(leaves), *states)


def unstack_cohort_results(results: Sequence[dict]) -> list[dict]:
  """Per-cohort metrics (stacked) back to one dict per client."""
  return [{k: v[j] for k, v in cohort.items()}
          for cohort in results for j in range(len(cohort["client_index"]))]


def per_client_table(results: Sequence[dict]) -> dict[str, np.ndarray]:
  """Per-client results as arrays, sorted by client index."""
  results = sorted(results, key=lambda r: int(r["client_index"]))
  return {key: np.array([r[key] for r in results]) for key in results[0]}


def evaluation_sample(population: int, size: int | None, seed: int) -> np.ndarray:
  """The clients evaluated: all, or `size` drawn once without replacement (seeded)."""
  if size is None or size >= population:
    return np.arange(population)
  return np.sort(np.random.default_rng([seed, population, size]).choice(
      population, size, replace=False))


def summarize(table: dict[str, np.ndarray],
              population: int | None = None) -> collections.OrderedDict:
  """The aggregate numbers of the module docstring, accuracies as fractions.

  When the table holds a sample of n of `population` clients, `test_accuracy_mean_se`
  is the standard error of its mean as an estimate of the population's mean:
  s / sqrt(n) * sqrt(1 - n / I), s the sample std (ddof 1); its square is unbiased for
  the variance of the mean of n clients drawn without replacement.
  """
  accuracy = table["test_accuracy"].astype(np.float64)
  num_train = table["num_train"].astype(np.float64)
  num_test = table["num_test"].astype(np.float64)
  worst = np.sort(accuracy)[:max(1, math.ceil(len(accuracy) / 10))]
  summary = collections.OrderedDict(
      train_loss=float(np.sum(num_train * table["train_loss"]) / num_train.sum()),
      train_accuracy_mean=float(np.mean(table["train_accuracy"])),
      test_loss_mean=float(np.mean(table["test_loss"])),
      test_accuracy_mean=float(accuracy.mean()),
      test_accuracy_pooled=float(np.sum(num_test * accuracy) / num_test.sum()),
      test_accuracy_std=float(accuracy.std()),
      test_accuracy_worst10=float(worst.mean()),
  )
  if "refit_test_accuracy" in table:
    refit = table["refit_test_accuracy"].astype(np.float64)
    summary.update(
        test_accuracy_refit_mean=float(refit.mean()),
        test_accuracy_refit_pooled=float(np.sum(num_test * refit) / num_test.sum()),
        train_loss_refit=float(np.sum(num_train * table["refit_train_loss"])
                               / num_train.sum()))
  return summary | _standard_error(accuracy, population)


def _standard_error(accuracy: np.ndarray, population: int | None) -> dict:
  n = len(accuracy)
  if population is None or n >= population:
    return {}
  if n < 2:
    return dict(test_accuracy_mean_se=float("nan"))
  return dict(test_accuracy_mean_se=float(
      accuracy.std(ddof=1) / np.sqrt(n) * np.sqrt(1 - n / population)))


def pooled_test_accuracy(table: dict[str, np.ndarray]) -> float:
  """Accuracy pooled over the clients' test examples (the reference code's protocol)."""
  n = table["num_test"].astype(np.float64)
  return float(np.sum(n * table["test_accuracy"]) / n.sum())
