"""PFLEGO's numbers against a central plain-Keras computation of grad L(psi)."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tests.helpers import BETA, MAX_CLASSES, NUM_CLASSES, RHO, SIZES, subset_estimate
from tests.helpers import pflego_process as build
from tff_pflego.algorithms import pflego, server_optimizers

@pytest.mark.parametrize("local_steps", [1, 4])
def test_full_participation_round_is_one_full_batch_gd_step(local_steps):
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES)
  process = build(3, 1.0, local_steps, total_examples=sum(SIZES))
  state = process.initialize()
  states = helpers.client_states(NUM_CLASSES, MAX_CLASSES)
  theta = [np.asarray(w) for w in state.model.trainable]

  new_state, new_states, metrics = process.next(
      state, [helpers.as_dataset(x, y) for x, y in data], states)

  grad_body, grad_heads, models = helpers.central_gradients(
      theta, [s["head"] for s in states], NUM_CLASSES, data,
      presteps=local_steps - 1, lr=BETA)
  for got, w, g in zip(new_state.model.trainable, theta, grad_body):
    np.testing.assert_allclose(got, w - RHO * g, atol=1e-5, rtol=1e-5)
  by_index = {int(s["client_index"]): s for s in new_states}
  for i, (model, (g_kernel, g_bias)) in enumerate(zip(models, grad_heads)):
    k = NUM_CLASSES[i]
    head = by_index[i]["head"]
    kernel, bias = (v.numpy() for v in model.layers[-1].trainable_variables)
    np.testing.assert_allclose(head["kernel"][:, :k], kernel - RHO * g_kernel,
                               atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(head["bias"][:k], bias - RHO * g_bias, atol=1e-5)
    # Absent classes' rows are untouched by masking.
    np.testing.assert_array_equal(head["kernel"][:, k:], states[i]["head"]["kernel"][:, k:])
  assert int(new_state.round_num) == 1
  assert float(metrics["train"]["num_examples"]) == sum(SIZES)
  # The round's train metrics: example-weighted means of the clients' own values.
  clients = sorted(metrics["clients"], key=lambda c: int(c["client_index"]))
  n = np.array([float(c["num_examples"]) for c in clients])
  for name in ("loss", "accuracy"):
    want = np.dot(n, [float(c[name]) for c in clients]) / n.sum()
    np.testing.assert_allclose(float(metrics["train"][name]), want, rtol=1e-6)
  assert int(metrics["train"]["num_clients"]) == len(SIZES)


def test_fixed_participation_estimator_is_unbiased_over_all_subsets():
  sizes, num_classes = (4, 7, 9, 6), (2, 2, 3, 3)
  data = helpers.synthetic_clients(sizes, num_classes, seed=1)
  process = build(4, 2 / 4, local_steps=2, total_examples=sum(sizes))
  state = process.initialize()
  states = helpers.client_states(num_classes, MAX_CLASSES)
  theta = [np.asarray(w) for w in state.model.trainable]
  exact, grad_heads, models = helpers.central_gradients(
      theta, [s["head"] for s in states], num_classes, data, presteps=1, lr=BETA)

  subsets = list(itertools.combinations(range(4), 2))
  assert len(subsets) == 6
  estimates = []
  for subset in subsets:
    estimate, heads = subset_estimate(process, state, data, states, subset)
    estimates.append(estimate)
    for i in subset:  # final head step: rho * (I/r) * alpha_i * grad_W l_i
      kernel = models[i].layers[-1].kernel.numpy()
      np.testing.assert_allclose(heads[i]["kernel"][:, :num_classes[i]],
                                 kernel - RHO * 2 * grad_heads[i][0], atol=1e-5)
  for layer, g in enumerate(exact):
    mean = np.mean([e[layer] for e in estimates], axis=0)
    np.testing.assert_allclose(mean, g, atol=2e-5, rtol=1e-4)
  # A single subset's estimate is NOT the gradient (the test can fail).
  assert not np.allclose(estimates[0][0], exact[0], atol=1e-4)


def test_binomial_participation_estimator_is_unbiased():
  sizes, num_classes, pi = (4, 7, 9), (2, 3, 3), 0.3
  data = helpers.synthetic_clients(sizes, num_classes, seed=2)
  process = build(3, pi, local_steps=1, total_examples=sum(sizes))
  state = process.initialize()
  states = helpers.client_states(num_classes, MAX_CLASSES)
  theta = [np.asarray(w) for w in state.model.trainable]
  exact, _, _ = helpers.central_gradients(theta, [s["head"] for s in states],
                                          num_classes, data)
  expectation = [np.zeros_like(g) for g in exact]
  for mask in itertools.product([0, 1], repeat=3):
    subset = [i for i in range(3) if mask[i]]
    if not subset:
      continue  # nobody reports: the estimate is 0
    p = pi ** len(subset) * (1 - pi) ** (3 - len(subset))
    estimate, _ = subset_estimate(process, state, data, states, subset)
    expectation = [a + p * e for a, e in zip(expectation, estimate)]
  for got, g in zip(expectation, exact):
    np.testing.assert_allclose(got, g, atol=2e-5, rtol=1e-4)


def test_paper_code_head_step_drops_alpha():
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES)
  process = build(3, 1.0, 1, total_examples=sum(SIZES), head_step="paper_code")
  state = process.initialize()
  states = helpers.client_states(NUM_CLASSES, MAX_CLASSES)
  theta = [np.asarray(w) for w in state.model.trainable]
  _, grad_heads, models = helpers.central_gradients(
      theta, [s["head"] for s in states], NUM_CLASSES, data)
  _, new_states, _ = process.next(state, [helpers.as_dataset(x, y) for x, y in data],
                                  states)
  for s in new_states:
    i = int(s["client_index"])
    alpha = SIZES[i] / sum(SIZES)
    kernel = models[i].layers[-1].kernel.numpy()
    np.testing.assert_allclose(s["head"]["kernel"][:, :NUM_CLASSES[i]],
                               kernel - RHO * grad_heads[i][0] / alpha, atol=1e-5)


def test_server_adam_matches_keras_adam_over_rounds():
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES)
  process = build(3, 1.0, 1, optimizer="adam", total_examples=sum(SIZES))
  state = process.initialize()
  states = helpers.client_states(NUM_CLASSES, MAX_CLASSES)
  theta = [tf.Variable(np.asarray(w)) for w in state.model.trainable]
  heads = [s["head"] for s in states]
  keras_adam = tf.keras.optimizers.legacy.Adam(learning_rate=RHO, beta_1=0.9,
                                               beta_2=0.999, epsilon=1e-7)
  datasets = [helpers.as_dataset(x, y) for x, y in data]
  for _ in range(3):
    grad_body, grad_heads, models = helpers.central_gradients(
        [v.numpy() for v in theta], heads, NUM_CLASSES, data)
    keras_adam.apply_gradients(zip(grad_body, theta))
    heads = [dict(kernel=np.concatenate([m.layers[-1].kernel.numpy() - RHO * g[0],
                                         h["kernel"][:, k:]], 1),
                  bias=np.concatenate([m.layers[-1].bias.numpy() - RHO * g[1],
                                       h["bias"][k:]]))
             for m, g, h, k in zip(models, grad_heads, heads, NUM_CLASSES)]
    state, states, _ = process.next(state, datasets, states)
    states = sorted(states, key=lambda s: int(s["client_index"]))
    # Adam divides by sqrt(v) + eps, so an entry whose gradient is near eps turns
    # float32 summation-order noise of the gradients into a visible step difference:
    # allow it on at most 1% of entries; the semantics are pinned on identical
    # gradients below. A wrong beta, eps or bias correction moves entries by O(rho).
    for got, want in zip(state.model.trainable, theta):
      np.testing.assert_allclose(got, want.numpy(), atol=1e-4)
      assert np.mean(np.abs(got - want.numpy()) < 1e-6) > 0.99


def test_server_optimizer_on_identical_gradients_is_keras_adam():
  """Same gradients in, same weights out: Keras-Adam semantics (b1 .9, b2 .999, eps 1e-7).

  Reference: the update in float64, w -= lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps).
  TFF's Adam and Keras' legacy Adam meet it to float32 precision; Keras 2.14's new Adam
  evaluates it in another float32 order and lands ~1e-6 (relative 1e-5) away.
  """
  rng = np.random.default_rng(5)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  optimizer = server_optimizers.build_server_optimizer("adam", RHO)
  opt_state = optimizer.initialize([tf.TensorSpec((3, 4), tf.float32)])
  ours = [tf.constant(w)]
  legacy, new = tf.Variable(w), tf.Variable(w)
  keras_legacy = tf.keras.optimizers.legacy.Adam(learning_rate=RHO, epsilon=1e-7)
  keras_new = tf.keras.optimizers.Adam(learning_rate=RHO, epsilon=1e-7)
  ref, m, v = w.astype(np.float64), 0.0, 0.0
  for t in range(1, 6):
    g = (rng.normal(size=(3, 4)) * 10.0 ** -t).astype(np.float32)
    opt_state, ours = optimizer.next(opt_state, ours, [tf.constant(g)])
    keras_legacy.apply_gradients([(tf.constant(g), legacy)])
    keras_new.apply_gradients([(tf.constant(g), new)])
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
    ref = ref - RHO * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(ours[0], ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours[0], legacy.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours[0], new.numpy(), atol=1e-5)  # ~1e-6 per step


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_cosine_server_rate_matches_its_closed_form_step_by_step(name):
  """Five server steps at rho_t = rho (f + (1 - f)(1 + cos(pi (t - 1)/(T - 1)))/2),
  T = 4 (the fifth holds f rho), against the update written out in float64."""
  rng = np.random.default_rng(7)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  rounds, fraction = 4, 0.25
  optimizer = server_optimizers.build_server_optimizer(name, RHO, "cosine", fraction,
                                                       rounds)
  opt_state = optimizer.initialize([tf.TensorSpec((3, 4), tf.float32)])
  ours, ref, m, v = [tf.constant(w)], w.astype(np.float64), 0.0, 0.0
  for t in range(1, 6):
    rate = RHO * (fraction + (1 - fraction) * (1 + np.cos(np.pi * min(t - 1, 3) / 3)) / 2)
    g = rng.normal(size=(3, 4)).astype(np.float32)
    opt_state, ours = optimizer.next(opt_state, ours, [tf.constant(g)])
    if name == "sgd":
      ref = ref - rate * g
    else:
      m = 0.9 * m + 0.1 * g
      v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
      ref = ref - rate * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
    np.testing.assert_allclose(ours[0], ref, rtol=1e-6, atol=1e-6)
  assert rate == pytest.approx(fraction * RHO)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_adams_last_step_is_read_back_from_its_state(schedule):
  """`adam_last_step` of the state after each of five updates (its rate from
  `rate_at`) is the change those updates made to the weights; SGD has no Adam state."""
  rng = np.random.default_rng(11)
  settings = types.SimpleNamespace(server_optimizer="adam", server_lr=RHO,
                                   server_lr_schedule=schedule,
                                   server_lr_final_fraction=0.25, schedule_rounds=4)
  optimizer = server_optimizers.from_config(settings)
  specs = [tf.TensorSpec((3, 4), tf.float32), tf.TensorSpec((2,), tf.float32)]
  opt_state = optimizer.initialize(specs)
  weights = [tf.constant(rng.normal(size=s.shape).astype(np.float32)) for s in specs]
  for t in range(1, 6):
    gradients = [tf.constant(rng.normal(size=s.shape).astype(np.float32)) for s in specs]
    opt_state, new = optimizer.next(opt_state, weights, gradients)
    steps = server_optimizers.adam_last_step(server_optimizers.adam_state(opt_state),
                                             server_optimizers.rate_at(settings, t - 1))
    for step, old, now in zip(steps, weights, new):
      # rtol: TF evaluates the bias correction in float32, where 1 - 0.999^t cancels.
      np.testing.assert_allclose(np.float64(now) - np.float64(old), step, rtol=1e-4)
    weights = new
  sgd = server_optimizers.build_server_optimizer("sgd", RHO, schedule, 0.25, 4)
  assert server_optimizers.adam_state(sgd.initialize(specs)) is None


def test_a_constant_server_rate_is_the_unscheduled_optimizer():
  constant = server_optimizers.build_server_optimizer("adam", RHO, "constant", 0.1, 200)
  assert type(constant) is type(server_optimizers.build_server_optimizer("adam", RHO))


@pytest.mark.parametrize("local_steps", [1, 3, 20])
def test_body_passes_are_counted_one_forward_one_backward(local_steps):
  # The joint gradient's forward pass is at the same theta as the head steps' features.
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES)
  process = build(3, 1.0, local_steps, total_examples=sum(SIZES))
  _, _, metrics = process.next(process.initialize(),
                               [helpers.as_dataset(x, y) for x, y in data],
                               helpers.client_states(NUM_CLASSES, MAX_CLASSES))
  assert [int(c["body_forward_passes"]) for c in metrics["clients"]] == [1, 1, 1]
  assert [int(c["body_backward_passes"]) for c in metrics["clients"]] == [1, 1, 1]


def test_head_steps_on_cached_features_equal_steps_recomputing_features():
  (x, y), = helpers.synthetic_clients((9,), (3,), seed=4)
  body = helpers.body_fn()
  head = helpers.client_states((3,), 3)[0]["head"]
  features = body(x)
  cached = pflego.head_gradient_steps(features, tf.constant(y),
                                      {k: tf.constant(v) for k, v in head.items()},
                                      tf.constant([True, True, True]), 5, BETA)
  recomputed = helpers.head_presteps([v.numpy() for v in body.trainable_variables],
                                     head, 3, x, y, 5, BETA)
  np.testing.assert_allclose(cached["kernel"], recomputed.layers[-1].kernel.numpy(),
                             atol=1e-6)
  np.testing.assert_allclose(cached["bias"], recomputed.layers[-1].bias.numpy(), atol=1e-6)
  assert not np.allclose(cached["kernel"], head["kernel"])  # the steps did something


def _head_setup(scale):
  (x, y), = helpers.synthetic_clients((30,), (3,), seed=6)
  features = tf.constant(scale * helpers.body_fn()(x).numpy())
  head = {k: tf.constant(v) for k, v in helpers.client_states((3,), 3)[0]["head"].items()}
  return features, tf.constant(y), head, tf.constant([True, True, True])


def _loss(features, y, head, mask):
  from tff_pflego.models import heads
  return float(heads.head_loss_and_accuracy(features, y, head["kernel"], head["bias"],
                                            mask)[0])


def test_monotone_head_steps_equal_gd_when_gd_is_stable():
  features, y, head, mask = _head_setup(1.0)
  gd = pflego.head_gradient_steps(features, y, head, mask, 10, 0.05, "gd")
  mono = pflego.head_gradient_steps(features, y, head, mask, 10, 0.05, "monotone_gd")
  np.testing.assert_allclose(mono["kernel"], gd["kernel"], atol=1e-7)
  assert _loss(features, y, gd, mask) < _loss(features, y, head, mask)


def test_monotone_head_steps_never_increase_the_loss_when_gd_diverges():
  features, y, head, mask = _head_setup(30.0)  # large features: beta far above 2/L
  start = _loss(features, y, head, mask)
  losses_gd, losses_mono = [], []
  for steps in range(1, 12):
    losses_gd.append(_loss(features, y, pflego.head_gradient_steps(
        features, y, head, mask, steps, 0.5, "gd"), mask))
    losses_mono.append(_loss(features, y, pflego.head_gradient_steps(
        features, y, head, mask, steps, 0.5, "monotone_gd"), mask))
  assert max(losses_gd) > start  # plain GD oscillates upward here
  assert all(b <= a + 1e-6 for a, b in zip([start] + losses_mono, losses_mono))
  assert losses_mono[-1] < start


@pytest.mark.parametrize("optimizer,lr", [("gd", 0.3), ("monotone_gd", 40.0)])
def test_head_steps_on_a_padded_batch_of_clients_equal_each_clients_own(optimizer, lr):
  """Evaluation refits a cohort's heads in one batch ([C, N_max, M], padding marked
  invalid): each client's result is the one it gets alone. At lr = 40 monotone GD
  rejects steps, so per-client acceptance and lr halving are exercised."""
  sizes, num_classes, max_classes = (9, 4, 6), (3, 2, 3), 3
  data = helpers.synthetic_clients(sizes, num_classes, seed=8)
  body = helpers.body_fn()
  states = helpers.client_states(num_classes, max_classes, seed=9)
  features = [body(x).numpy() for x, _ in data]
  alone = [pflego.head_gradient_steps(
      tf.constant(f), tf.constant(y), {k: tf.constant(v) for k, v in s["head"].items()},
      tf.range(max_classes) < k, 6, lr, optimizer)
      for f, (_, y), s, k in zip(features, data, states, num_classes)]
  n_max, m = max(sizes), features[0].shape[1]
  padded_x, padded_y = np.zeros((3, n_max, m), np.float32), np.zeros((3, n_max), np.int32)
  valid = np.zeros((3, n_max), bool)
  for c, (f, (_, y)) in enumerate(zip(features, data)):
    padded_x[c, :len(y)], padded_y[c, :len(y)], valid[c, :len(y)] = f, y, True
    padded_x[c, len(y):] = 7.0  # padding must not matter, whatever it holds
  together = pflego.head_gradient_steps(
      tf.constant(padded_x), tf.constant(padded_y),
      {k: tf.constant(np.stack([s["head"][k] for s in states])) for k in ("kernel", "bias")},
      tf.constant(np.arange(max_classes)[None, :] < np.array(num_classes)[:, None]), 6, lr,
      optimizer, valid=tf.constant(valid))
  for c in range(3):
    for key in ("kernel", "bias"):
      np.testing.assert_allclose(together[key][c], alone[c][key], rtol=1e-5, atol=1e-6)
  if optimizer == "monotone_gd":  # the rejections happened: plain GD differs
    plain = pflego.head_gradient_steps(
        tf.constant(features[0]), tf.constant(data[0][1]),
        {k: tf.constant(v) for k, v in states[0]["head"].items()},
        tf.range(max_classes) < num_classes[0], 6, lr, "gd")
    assert not np.allclose(plain["kernel"], alone[0]["kernel"], atol=1e-3)
