"""ASCD-PFL on PFLEGO's objective against a hand-written iteration on plain Keras models."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import IMAGE_SHAPE, MAX_CLASSES, NUM_CLASSES, SIZES
from tff_pflego.algorithms import ascd_pfl

CLIENT_LR, SERVER_LR, P_W, MOMENTUM, Z_STEP, SEED = 0.3, 0.2, 0.4, 0.6, 2.5, 3


def _process(participation_prob):
  return ascd_pfl.build_ascd_pfl_process(
      helpers.body_fn, image_shape=IMAGE_SHAPE, max_classes=MAX_CLASSES,
      total_examples=sum(SIZES), participation_prob=participation_prob,
      client_lr=CLIENT_LR, server_lr=SERVER_LR, p_w=P_W, momentum=MOMENTUM,
      z_step=Z_STEP, seed=SEED)


def _initial_states():
  return [ascd_pfl.initial_ascd_client_state(i, k, feature_dim=200,
                                             max_classes=MAX_CLASSES, seed=0)
          for i, k in enumerate(NUM_CLASSES)]


def _couple(y, z):
  return MOMENTUM * z + (1 - MOMENTUM) * y


def _gradients(body, head, k, x, y):
  """grad of l_i over (body, head kernel, head bias) by a plain Keras model."""
  model = helpers.keras_model(body, head, k)
  with tf.GradientTape() as tape:
    loss = helpers.loss_fn(model, x, y)
  body_vars = model.layers[0].trainable_variables
  grads = tape.gradient(loss, body_vars + model.layers[-1].trainable_variables)
  return [g.numpy() for g in grads[:len(body_vars)]], [g.numpy() for g in grads[-2:]]


def _reference_round(round_num, body_y, body_z, heads, data, cohort, q):
  """One round of the module docstring's iteration, client by client, features
  recomputed by the Keras model at every head iteration."""
  body_x = [_couple(y, z) for y, z in zip(body_y, body_z)]
  k_iterations = int(ascd_pfl.head_iterations(SEED, round_num, P_W))
  head_step = CLIENT_LR / ((1 - P_W) * q)
  estimate = [np.zeros_like(w) for w in body_x]
  for i in cohort:
    (x, labels), k = data[i], NUM_CLASSES[i]
    y_w, z_w = heads[i]
    for _ in range(k_iterations):
      x_w = [_couple(a, b) for a, b in zip(y_w, z_w)]
      _, g = _gradients(body_x, dict(kernel=x_w[0], bias=x_w[1]), k, x, labels)
      g = [np.pad(g[0], ((0, 0), (0, MAX_CLASSES - k))), np.pad(g[1], (0, MAX_CLASSES - k))]
      y_w = [a - head_step * b for a, b in zip(x_w, g)]
      z_w = [a - Z_STEP * head_step * b for a, b in zip(z_w, g)]
    heads[i] = (y_w, z_w)
    x_w = [_couple(a, b) for a, b in zip(y_w, z_w)]
    g_body, _ = _gradients(body_x, dict(kernel=x_w[0], bias=x_w[1]), k, x, labels)
    alpha = len(labels) / sum(SIZES)
    estimate = [e + alpha * g / q for e, g in zip(estimate, g_body)]
  step = SERVER_LR / P_W
  return ([x - step * g for x, g in zip(body_x, estimate)],
          [z - Z_STEP * step * g for z, g in zip(body_z, estimate)], k_iterations)


@pytest.mark.parametrize("cohorts,q", [([[0, 1, 2]] * 4, 1.0),
                                       ([[0, 2], [1, 2], [0, 1], [0, 2]], 2 / 3)])
def test_rounds_match_the_iteration_written_out(cohorts, q):
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES)
  process = _process(q)
  state = process.initialize()
  states = _initial_states()
  body_y = [np.asarray(w, np.float64) for w in state.model.trainable]
  body_z = [w.copy() for w in body_y]
  heads = [([np.asarray(s["head"]["kernel"], np.float64), np.asarray(s["head"]["bias"])],
            [np.asarray(s["head"]["kernel"], np.float64), np.asarray(s["head"]["bias"])])
           for s in states]
  iterations = []
  for round_num, cohort in enumerate(cohorts):
    body_y, body_z, k = _reference_round(round_num, body_y, body_z, heads, data, cohort, q)
    iterations.append(k)
    state, new_states, metrics = process.next(
        state, [helpers.as_dataset(*data[i]) for i in cohort], [states[i] for i in cohort])
    for s in new_states:
      states[int(s["client_index"])] = s
    assert [int(c["body_forward_passes"]) for c in metrics["clients"]] == [1] * len(cohort)
  assert sum(iterations) > 0 and 0 in iterations  # both kinds of round were exercised
  got_y = ascd_pfl.body_weights(state).trainable
  got_x = state.model.trainable
  for y, z, g_y, g_x in zip(body_y, body_z, got_y, got_x):
    np.testing.assert_allclose(g_y, y, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(g_x, _couple(y, z), atol=2e-5, rtol=1e-4)
  for i, (y_w, z_w) in enumerate(heads):
    for key, y, z in zip(("kernel", "bias"), y_w, z_w):
      np.testing.assert_allclose(states[i]["head"][key], y, atol=2e-5, rtol=1e-4)
      np.testing.assert_allclose(states[i][ascd_pfl.HEAD_Z][key], z, atol=2e-5, rtol=1e-4)


def test_head_iterations_are_geometric_and_a_function_of_seed_and_round():
  draws = np.array([int(ascd_pfl.head_iterations(5, t, 0.25)) for t in range(4000)])
  again = np.array([int(ascd_pfl.head_iterations(5, t, 0.25)) for t in range(50)])
  np.testing.assert_array_equal(draws[:50], again)
  assert not np.array_equal(
      draws[:50], [int(ascd_pfl.head_iterations(6, t, 0.25)) for t in range(50)])
  # P(K = k) = (1 - p)^k p: frequencies within 4 standard errors, mean (1 - p) / p.
  for k in range(4):
    p_k = 0.75 ** k * 0.25
    assert abs(np.mean(draws == k) - p_k) < 4 * np.sqrt(p_k * (1 - p_k) / len(draws))
  assert abs(draws.mean() - 3.0) < 4 * np.sqrt(0.75 / 0.25 ** 2 / len(draws))


def test_coupled_body_step_without_momentum_is_a_block_gradient_step():
  step = ascd_pfl.CoupledBodyStep(learning_rate=0.2, p_w=0.5, momentum=0.0, z_step=3.0)
  weights = [tf.constant([1.0, -2.0])]
  state = step.initialize([tf.TensorSpec([2], tf.float32)])
  state, new = step.next(state, weights, [tf.constant([0.5, 1.0])])
  np.testing.assert_allclose(new[0], [1.0 - 0.4 * 0.5, -2.0 - 0.4])
  np.testing.assert_allclose(state["y_offset"][0], [0.0, 0.0])


@pytest.mark.parametrize("value,message", [
    (dict(p_w=1.0), "p_w must be in (0, 1)"), (dict(momentum=1.0), "momentum"),
    (dict(z_step=0.0), "z_step")])
def test_bad_parameters_are_refused(value, message):
  kwargs = dict(image_shape=IMAGE_SHAPE, max_classes=MAX_CLASSES, total_examples=10,
                participation_prob=1.0, client_lr=0.1, server_lr=0.1, p_w=0.5,
                momentum=0.5, z_step=1.0, seed=0) | value
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    ascd_pfl.build_ascd_pfl_process(helpers.body_fn, **kwargs)


def test_a_resumed_run_ends_as_an_uninterrupted_one(prepared, tmp_path):
  """4 rounds straight against 2 rounds, then the same run resumed to 4: the K draws
  (the distributor's round), the body's offsets and the heads' z come back from the
  checkpoint, so every evaluation is the same."""
  import csv
  from tff_pflego.experiment import ExperimentConfig, run_experiment

  def run(rounds, name):
    return run_experiment(ExperimentConfig(
        dataset="fashion_mnist", algorithm="ascd_pfl", num_clients=5, clients_per_round=2,
        rounds=rounds, output_dir=str(tmp_path / name), data_dir=prepared,
        progress=False, checkpoint_every=1, ascd_p_w=0.3))

  def rows(name):
    with open(tmp_path / name / "metrics.csv") as f:
      return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in csv.DictReader(f)]

  straight = run(4, "straight")
  run(2, "cut")
  resumed = run(4, "cut")
  assert resumed["final"] == straight["final"]
  assert rows("cut") == rows("straight") and len(rows("straight")) == 5


def test_the_ledger_counts_the_body_and_k_down_and_the_body_gradient_up():
  from tff_pflego.algorithms import registry
  from tff_pflego.training import ledger
  algorithm = registry.build_algorithm("ascd_pfl", helpers.algorithm_config(
      participation_prob=0.5, ascd_p_w=0.3))
  body = 4 * (16 * 200 + 200)  # Dense(200) on a 4x4x1 input, float32
  assert ledger.traffic_per_client(algorithm.broadcast_type, algorithm.update_type) == (
      dict(bytes_down=body + 4, bytes_up=body + 4))  # + K (int32) / + N_i (float32)
