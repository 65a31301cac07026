"""The reported numbers: per-client evaluation and its summary, against hand computations."""

import collections
import csv
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tff_pflego.algorithms.model_types import model_types
from tff_pflego.training import evaluation

SIZES, NUM_CLASSES, MAX_CLASSES = (6, 6, 6), (2, 3, 2), 3


def _dataset_computation(types, clients):
  """client id (int32) -> that client's dataset, like `ClientData.dataset_computation`."""
  xs, ys = np.stack([x for x, _ in clients]), np.stack([y for _, y in clients])

  @tff.tensorflow.computation(np.int32)
  def dataset_of(client_id):
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=tf.gather(tf.constant(xs), client_id),
        y=tf.gather(tf.constant(ys), client_id))).batch(4)

  assert dataset_of.type_signature.result.is_equivalent_to(types.dataset)
  return dataset_of


def _random_states(seed):
  rng = np.random.default_rng(seed)
  states = helpers.client_states(NUM_CLASSES, MAX_CLASSES, seed)
  for state in states:  # non-zero heads, so that accuracies differ between clients
    state["head"]["kernel"] = rng.normal(0, 0.3, state["head"]["kernel"].shape).astype(
        np.float32)
    state["head"]["bias"] = rng.normal(0, 0.3, MAX_CLASSES).astype(np.float32)
  return states


def test_personalized_evaluation_equals_each_clients_keras_model():
  """Every client's loss and accuracy on train and test are its own Keras model's
  (body + its K_i-class head, padded classes masked), whatever order TFF returns them in."""
  types = model_types(helpers.body_fn, helpers.IMAGE_SHAPE, MAX_CLASSES)
  train = helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=1)
  test = helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=2)
  evaluate = evaluation.build_personalized_evaluation(
      helpers.body_fn, types, _dataset_computation(types, train),
      _dataset_computation(types, test))
  body = helpers.body_fn()
  weights = tff.learning.models.ModelWeights.from_model(body)
  weights = tf.nest.map_structure(lambda v: v.numpy(), weights)
  states = _random_states(seed=3)
  order = [2, 0, 1]  # ids in another order than the client indices
  table = evaluation.per_client_table(
      evaluate(weights, order, [states[i] for i in order]))

  np.testing.assert_array_equal(table["client_index"], [0, 1, 2])
  for i, k in enumerate(NUM_CLASSES):
    model = helpers.keras_model(weights.trainable, states[i]["head"], k)
    for part, (x, y) in (("train", train[i]), ("test", test[i])):
      np.testing.assert_allclose(table[f"{part}_loss"][i], helpers.loss_fn(model, x, y),
                                 rtol=1e-5)
      want = np.mean(np.argmax(model(x).numpy(), -1) == y)
      assert np.isclose(table[f"{part}_accuracy"][i], want), (i, part)
      assert table[f"num_{part}"][i] == len(y)


def test_summary_is_the_documented_formulas():
  accuracy = np.array([0.9, 0.5, 1.0, 0.7, 0.8, 0.6, 0.95, 0.85, 0.75, 0.65, 0.55])
  n_test = np.arange(1, 12) * 3
  n_train = np.arange(11, 0, -1) * 10
  train_loss = np.linspace(0.1, 1.1, 11)
  table = dict(test_accuracy=accuracy, num_test=n_test, num_train=n_train,
               train_loss=train_loss, train_accuracy=accuracy / 2,
               test_loss=train_loss * 2)
  got = evaluation.summarize(table)

  alpha = n_train / n_train.sum()
  assert np.isclose(got["train_loss"], np.sum(alpha * train_loss))  # L(psi), eq. (1)
  assert np.isclose(got["test_accuracy_mean"], accuracy.sum() / 11)
  assert np.isclose(got["test_accuracy_pooled"], np.dot(n_test, accuracy) / n_test.sum())
  assert np.isclose(got["test_accuracy_std"],
                    math.sqrt(np.mean((accuracy - accuracy.mean()) ** 2)))
  # the worst ceil(11 / 10) = 2 clients
  assert np.isclose(got["test_accuracy_worst10"], (0.5 + 0.55) / 2)
  assert np.isclose(got["train_accuracy_mean"], accuracy.mean() / 2)
  assert np.isclose(got["test_loss_mean"], np.mean(train_loss * 2))
  assert np.isclose(evaluation.pooled_test_accuracy(table), got["test_accuracy_pooled"])


def _ragged_clients(sizes, num_classes, seed):
  """Clients of different sizes, as (x, y) arrays and as a reader of client "files"
  (here client ids): a TF function from a vector of ids to their examples, in order."""
  clients = helpers.synthetic_clients(sizes, num_classes, seed=seed)
  offsets = np.cumsum([0] + list(sizes))
  xs = np.concatenate([x for x, _ in clients])
  ys = np.concatenate([y for _, y in clients])

  def read_files(client_ids):  # traced inside the computation: its own constants
    rows = tf.ragged.range(tf.gather(offsets, client_ids),
                           tf.gather(offsets, client_ids + 1)).flat_values
    return tf.data.Dataset.from_tensor_slices(collections.OrderedDict(
        x=tf.gather(tf.constant(xs), rows), y=tf.gather(tf.constant(ys), rows))).batch(4)

  return clients, read_files


class _CohortCase:
  """Clients of 1 to 9 examples and K_i = 1..3 with random heads, their train and test
  "files" read by one reader (ids 0..5 and 6..11), cut into shuffled cohorts, one of
  one client."""
  sizes, num_classes = (5, 1, 9, 3, 7, 2), (2, 3, 1, 3, 2, 3)
  cohorts = [np.array([4, 0, 2]), np.array([5]), np.array([1, 3])]

  def __init__(self):
    self.types = model_types(helpers.body_fn, helpers.IMAGE_SHAPE, MAX_CLASSES)
    clients, self.read_files = _ragged_clients(self.sizes + self.sizes[::-1],
                                               self.num_classes * 2, seed=4)
    self.train, self.test = clients[:len(self.sizes)], clients[len(self.sizes):]
    self.weights = tf.nest.map_structure(
        lambda v: v.numpy(),
        tff.learning.models.ModelWeights.from_model(helpers.body_fn()))
    rng = np.random.default_rng(6)
    self.states = helpers.client_states(self.num_classes, MAX_CLASSES, seed=6)
    for state in self.states:
      state["head"]["kernel"] = rng.normal(0, 0.3, state["head"]["kernel"].shape).astype(
          np.float32)
      state["head"]["bias"] = rng.normal(0, 0.3, MAX_CLASSES).astype(np.float32)

  def evaluate(self, refit=None, parts=evaluation.PARTS,
               cohorts=None) -> dict[str, np.ndarray]:
    cohorts = self.cohorts if cohorts is None else cohorts
    evaluate = evaluation.build_cohort_evaluation(helpers.body_fn, self.types,
                                                  self.read_files, path_dtype=np.int32,
                                                  refit=refit, parts=parts)
    files = dict(train=np.arange(6, dtype=np.int32), test=np.arange(6, 12, dtype=np.int32))
    num_examples = dict(train=np.array(self.sizes), test=np.array(self.sizes[::-1]))
    results = evaluate(
        self.weights,
        [evaluation.cohort_input(files, num_examples, c, parts) for c in cohorts],
        [evaluation.stack_states([self.states[i] for i in c]) for c in cohorts])
    return evaluation.per_client_table(evaluation.unstack_cohort_results(results))


def test_cohort_evaluation_equals_each_clients_keras_model():
  """One computation per cohort gives every client's own numbers: clients of 1 to 9
  examples and K_i = 1..3 share cohorts, in shuffled order, one cohort of one client."""
  case = _CohortCase()
  sizes, num_classes, train, test = case.sizes, case.num_classes, case.train, case.test
  weights, states, table = case.weights, case.states, case.evaluate()

  np.testing.assert_array_equal(table["client_index"], np.arange(len(sizes)))
  for i, k in enumerate(num_classes):
    model = helpers.keras_model(weights.trainable, states[i]["head"], MAX_CLASSES)
    for part, (x, y) in (("train", train[i]), ("test", test[i])):
      logits = model(x).numpy()
      logits[:, k:] = -1e9  # the client's own K_i classes only
      want_loss = np.mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
      np.testing.assert_allclose(table[f"{part}_loss"][i], want_loss, rtol=1e-5)
      assert np.isclose(table[f"{part}_accuracy"][i], np.mean(np.argmax(logits, -1) == y))
      assert table[f"num_{part}"][i] == len(y)


def test_test_part_alone_gives_the_test_numbers_of_both_parts():
  """The sampled protocol scores the test part only, in cohorts of its own: every
  client's test numbers are those of the evaluation of both parts."""
  case = _CohortCase()
  both = case.evaluate()
  alone = case.evaluate(parts=("test",), cohorts=[np.array([3, 1, 5, 0]),
                                                  np.array([2, 4])])
  assert sorted(alone) == ["client_index", "num_test", "test_accuracy", "test_loss"]
  for key in alone:
    np.testing.assert_array_equal(alone[key], both[key], err_msg=key)
  assert len(set(both["test_accuracy"])) > 2  # clients differ: a mix-up would show


@pytest.mark.parametrize("parts", [(), ("test", "train"), ("valid",), ("test", "test")])
def test_parts_other_than_train_and_test_in_order_are_refused(parts):
  with pytest.raises(ValueError, match="parts"):
    evaluation.check_parts(parts)


def test_a_refit_needs_both_parts():
  with pytest.raises(ValueError, match="refit"):
    evaluation.check_parts(("test",), refit=evaluation.HeadRefit(steps=2, learning_rate=0.1,
                                                       optimizer="gd"))


def test_the_drivers_sampled_figure_is_the_old_body_with_the_new_heads(prepared,
                                                                      tmp_path):
  """rounds.csv's test_accuracy_sampled_pooled of PFLEGO at round t: the round's clients
  scored on their test examples with the body they trained with (theta_{t-1}) and the
  heads they sent back, pooled; recomputed here with the Keras body and numpy."""
  from tff_pflego import experiment
  from tff_pflego.training import driver
  setting = dict(num_clients=5, clients_per_round=2, local_steps=3, seed=0)
  run, algorithm = experiment.prepare_training("fashion_mnist", "pflego", prepared,
                                               **setting)
  driver.train(algorithm, run.data, run.sampler, driver.RunConfig(
      rounds=2, output_dir=str(tmp_path), eval_every=100, progress=False))
  with open(tmp_path / "rounds.csv", newline="") as f:
    reported = [float(r["test_accuracy_sampled_pooled"]) for r in csv.DictReader(f)]

  again, _ = experiment.prepare_training("fashion_mnist", "pflego", prepared, **setting)
  data, sampler = again.data, again.sampler
  state = algorithm.process.initialize()
  heads = {i: algorithm.initial_client_state(i, int(data.num_classes[i]))
           for i in range(data.num_clients)}
  body = algorithm.body_fn()
  want = []
  for _ in range(2):
    chosen = sampler.sample()
    trained_with = state.model.trainable
    state, states, _ = algorithm.process.next(
        state, [data.client_ids[i] for i in chosen], [heads[i] for i in chosen])
    correct = total = 0
    for i, client_state in zip(chosen, states):
      heads[i] = client_state
      for variable, value in zip(body.trainable_variables, trained_with):
        variable.assign(value)
      x, y = data.client_arrays(i, "test")
      k = int(data.num_classes[i])
      logits = (body(x, training=False).numpy() @ client_state["head"]["kernel"][:, :k]
                + client_state["head"]["bias"][:k])
      correct += int(np.sum(np.argmax(logits, -1) == y))
      total += len(y)
    want.append(correct / total)
  assert reported == pytest.approx(want, abs=1e-12)
  assert want[0] != want[1]


def test_cohorts_bound_examples_and_clients_and_cover_every_client():
  sizes = np.array([600] * 5 + [12] * 300 + [5000])
  cohorts = evaluation.plan_cohorts(sizes)
  np.testing.assert_array_equal(np.concatenate(cohorts), np.arange(len(sizes)))
  for cohort in cohorts:
    assert len(cohort) <= evaluation.MAX_COHORT_CLIENTS
    assert len(cohort) == 1 or sizes[cohort].sum() <= evaluation.COHORT_EXAMPLES
  assert [len(c) for c in evaluation.plan_cohorts(np.array([1, 1]))] == [1, 1]


def test_sampled_evaluation_standard_error_is_unbiased_over_every_sample():
  """Over all C(7, 3) samples of 3 of 7 clients, the mean of se^2 equals the exact
  variance of the sample mean, and the sample is a fixed, seeded subset."""
  import itertools
  population = np.array([0.9, 0.55, 1.0, 0.7, 0.8, 0.62, 0.95])
  samples = list(itertools.combinations(range(7), 3))
  means, se2 = [], []
  for sample in samples:
    table = dict(test_accuracy=population[list(sample)], num_test=np.ones(3),
                 num_train=np.ones(3), train_loss=np.zeros(3), train_accuracy=np.ones(3),
                 test_loss=np.zeros(3))
    got = evaluation.summarize(table, population=7)
    means.append(got["test_accuracy_mean"])
    se2.append(got["test_accuracy_mean_se"] ** 2)
  assert np.isclose(np.mean(means), population.mean())
  assert np.isclose(np.mean(se2), np.var(means))
  chosen = evaluation.evaluation_sample(100, 10, seed=0)
  assert len(set(chosen)) == 10 and np.all(np.diff(chosen) > 0)
  np.testing.assert_array_equal(chosen, evaluation.evaluation_sample(100, 10, seed=0))
  np.testing.assert_array_equal(evaluation.evaluation_sample(5, None, 0), np.arange(5))


REFIT = evaluation.HeadRefit(steps=4, learning_rate=0.5, optimizer="gd")


def _refit_reference(weights, state, k, train, test):
  """The refit protocol by hand: a Keras model of the client's K_i classes takes 4
  head-only GD steps on its train data (features recomputed each step), then scores."""
  model = helpers.head_presteps(weights.trainable, state["head"], k, *train, REFIT.steps,
                                REFIT.learning_rate)
  x, y = test
  return dict(refit_train_loss=helpers.loss_fn(model, *train),
              refit_test_loss=helpers.loss_fn(model, x, y),
              refit_test_accuracy=np.mean(np.argmax(model(x).numpy(), -1) == y))


def test_refit_evaluation_equals_head_steps_then_scoring_in_both_paths():
  """Per client and in cohorts, the refit scores are those of the client's model after
  tau - 1 head-only steps on the current body; the plain scores stay as they were."""
  case = _CohortCase()
  sizes, num_classes, train, test = case.sizes, case.num_classes, case.train, case.test
  weights, states = case.weights, case.states
  in_cohorts, without = case.evaluate(REFIT), case.evaluate()
  for key in without:
    np.testing.assert_allclose(in_cohorts[key], without[key], rtol=1e-6, err_msg=key)

  for i, k in enumerate(num_classes):
    want = _refit_reference(weights, states[i], k, train[i], test[i])
    for key, value in want.items():
      np.testing.assert_allclose(in_cohorts[key][i], value, rtol=2e-5, atol=1e-6,
                                 err_msg=f"client {i} {key}")
  several = np.array(num_classes) > 1  # K_i = 1: the loss is 0 whatever the head
  assert np.all(in_cohorts["refit_train_loss"][several]
                < in_cohorts["train_loss"][several] - 1e-3)  # the steps did something

  summary = evaluation.summarize(in_cohorts)
  alpha = np.array(sizes) / sum(sizes)
  assert np.isclose(summary["train_loss_refit"], np.sum(alpha * in_cohorts["refit_train_loss"]))
  assert np.isclose(summary["test_accuracy_refit_mean"],
                    np.mean(in_cohorts["refit_test_accuracy"]))


def test_refit_evaluation_per_client_equals_the_reference():
  types = model_types(helpers.body_fn, helpers.IMAGE_SHAPE, MAX_CLASSES)
  train = helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=1)
  test = helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=2)
  evaluate = evaluation.build_personalized_evaluation(
      helpers.body_fn, types, _dataset_computation(types, train),
      _dataset_computation(types, test), refit=REFIT)
  weights = tf.nest.map_structure(
      lambda v: v.numpy(), tff.learning.models.ModelWeights.from_model(helpers.body_fn()))
  states = _random_states(seed=3)
  table = evaluation.per_client_table(evaluate(weights, [0, 1, 2], states))
  for i, k in enumerate(NUM_CLASSES):
    for key, value in _refit_reference(weights, states[i], k, train[i], test[i]).items():
      np.testing.assert_allclose(table[key][i], value, rtol=2e-5, atol=1e-6,
                                 err_msg=f"client {i} {key}")
