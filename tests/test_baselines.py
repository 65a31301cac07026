"""The model-averaging baselines against hand-computed GD on plain Keras models."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from tff_pflego.algorithms import averaging, fedbabu, inspection, pflego, registry
from tff_pflego.algorithms.model_types import initial_client_state, model_types
from tff_pflego.algorithms.local_training import LocalPhase

K = 3  # every client uses all K_max = 3 classes here, so no masking is involved
LR, TAU = 0.1, 3


def _process(plan):
  return averaging.build_averaging_process(helpers.body_fn, plan,
                                           image_shape=helpers.IMAGE_SHAPE, max_classes=K)


def _descend(model, variables, x, y, steps, lr, momentum=0.0, prox_mu=0.0, anchor=None):
  """`steps` full-batch heavy-ball steps on l + (mu/2)||v - a||^2 over `variables` of a
  plain Keras model: m <- momentum m + g, v <- v - lr m (m = 0 first; momentum 0 is
  plain GD), in float64 numpy; a = `anchor`, by default the starting values."""
  values = [v.numpy().astype(np.float64) for v in variables]
  anchor = values if anchor is None else [np.asarray(a, np.float64) for a in anchor]
  velocity = [np.zeros_like(v) for v in values]
  for _ in range(steps):
    with tf.GradientTape() as tape:
      loss = helpers.loss_fn(model, x, y)
    grads = tape.gradient(loss, variables)
    velocity = [momentum * m + g.numpy() + prox_mu * (v - a)
                for m, g, v, a in zip(velocity, grads, values, anchor)]
    values = [v - lr * m for v, m in zip(values, velocity)]
    for variable, value in zip(variables, values):
      variable.assign(value.astype(np.float32))


def _keras_gd(weights, head, x, y, steps, lr, prox_mu=0.0, anchor=None):
  """`steps` full-batch GD steps on l + (mu/2)||w - a||^2 of the plain Keras model with
  body `weights` and `head`; returns its weights."""
  model = helpers.keras_model(weights, head, K)
  _descend(model, model.trainable_variables, x, y, steps, lr, prox_mu=prox_mu,
           anchor=anchor)
  return [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("name,mu", [("fedavg", 0.0), ("fedprox", 0.7)])
def test_one_client_round_is_tau_hand_computed_steps(name, mu):
  (x, y), = helpers.synthetic_clients((9,), (K,), seed=5)
  process = _process(helpers.plan(name, TAU, LR, prox_mu=mu))
  state = process.initialize()
  weights = list(state.model.trainable)
  head = dict(kernel=weights[-2], bias=weights[-1])
  new_state, _, metrics = process.next(state, [helpers.as_dataset(x, y)],
                                       helpers.client_states((K,), K))
  expected = _keras_gd(weights[:-2], head, x, y, TAU, LR, prox_mu=mu)
  for got, want in zip(new_state.model.trainable, expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The prox term matters after the first step (the test can fail).
  if mu:
    plain = _keras_gd(weights[:-2], head, x, y, TAU, LR)
    assert not np.allclose(plain[0], expected[0], atol=1e-6)
  counts = metrics["clients"][0]
  assert (counts["body_forward_passes"], counts["body_backward_passes"]) == (TAU, TAU)


def test_fedprox_with_mu_zero_is_fedavg():
  data = helpers.synthetic_clients((6, 9), (K, K), seed=6)
  datasets = [helpers.as_dataset(*d) for d in data]
  results = []
  for plan in (helpers.plan("fedavg", TAU, LR),
               helpers.plan("fedprox", TAU, LR, prox_mu=0.0)):
    process = _process(plan)
    state, _, _ = process.next(process.initialize(), datasets,
                               helpers.client_states((K, K), K))
    results.append(state.model.trainable)
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)


def test_two_clients_are_averaged_by_examples():
  data = helpers.synthetic_clients((4, 12), (K, K), seed=7)
  process = _process(helpers.plan("fedavg", TAU, LR))
  state = process.initialize()
  weights = list(state.model.trainable)
  head = dict(kernel=weights[-2], bias=weights[-1])
  new_state, _, _ = process.next(state, [helpers.as_dataset(*d) for d in data],
                                 helpers.client_states((K, K), K))
  local = [_keras_gd(weights[:-2], head, x, y, TAU, LR) for x, y in data]
  for j, got in enumerate(new_state.model.trainable):
    np.testing.assert_allclose(got, (4 * local[0][j] + 12 * local[1][j]) / 16,
                               rtol=1e-5, atol=1e-6)


def _types():
  return model_types(helpers.body_fn, helpers.IMAGE_SHAPE, K)


@pytest.mark.parametrize("name", ["fedper", "fedrep", "fedbabu"])
def test_personal_heads_never_reach_the_server(name):
  types = _types()
  work = averaging.build_client_work(
      helpers.body_fn, helpers.plan(name, TAU, LR), types)
  assert work.type_signature.result.update == types.weights.trainable
  head_shapes = {(types.feature_dim, K), (K,)}
  shapes = {tuple(t.shape) for t in work.type_signature.result.update}
  assert not shapes & head_shapes
  assert not helpers.plan(name, TAU, LR).shared_head


def test_pflego_sends_no_head():
  types = _types()
  work = pflego.build_client_work(
      helpers.body_fn, types, local_steps=2, client_lr=0.1, server_lr=0.1,
      participation_prob=1.0, total_examples=10, head_step="exact", head_optimizer="gd")
  assert work.type_signature.result.update == types.weights.trainable


def test_personal_heads_stay_with_their_clients():
  data = helpers.synthetic_clients((5, 8), (K, K), seed=8)
  states = helpers.client_states((K, K), K, seed=3)
  process = _process(helpers.plan("fedper", TAU, LR))
  state = process.initialize()
  theta = list(state.model.trainable)
  _, new_states, _ = process.next(state, [helpers.as_dataset(*d) for d in data], states)
  by_index = {int(s["client_index"]): s["head"] for s in new_states}
  for i, (x, y) in enumerate(data):  # client i's head: its own tau joint steps
    expected = _keras_gd(theta, states[i]["head"], x, y, TAU, LR)
    np.testing.assert_allclose(by_index[i]["kernel"], expected[-2], rtol=1e-5, atol=1e-6)


def test_fedbabu_head_is_fixed_and_fedrep_phases_touch_one_part_each():
  (x, y), = helpers.synthetic_clients((7,), (K,), seed=9)
  fixed = fedbabu.orthogonal_head(200, K, seed=0)
  np.testing.assert_allclose(fixed["kernel"].T @ fixed["kernel"], np.eye(K), atol=1e-6)
  state_in = [dict(helpers.client_states((K,), K)[0], head=fixed)]
  process = _process(helpers.plan("fedbabu", TAU, LR))
  state = process.initialize()
  new_state, (babu,), metrics = process.next(state, [helpers.as_dataset(x, y)], state_in)
  np.testing.assert_array_equal(babu["head"]["kernel"], fixed["kernel"])
  assert not np.allclose(new_state.model.trainable[0], state.model.trainable[0])
  assert int(metrics["clients"][0]["body_backward_passes"]) == 5

  states = helpers.client_states((K,), K)
  head_only = _process(averaging.AveragingPlan((LocalPhase("head", TAU, LR),)))
  s0 = head_only.initialize()
  s1, (after,), m = head_only.next(s0, [helpers.as_dataset(x, y)], states)
  for a, b in zip(s0.model.trainable, s1.model.trainable):
    np.testing.assert_array_equal(a, b)  # head steps leave the body unchanged
  assert not np.allclose(after["head"]["kernel"], states[0]["head"]["kernel"])
  assert int(m["clients"][0]["body_backward_passes"]) == 0
  body_only = _process(averaging.AveragingPlan((LocalPhase("body", TAU, LR),)))
  s1, (after,), _ = body_only.next(body_only.initialize(), [helpers.as_dataset(x, y)],
                                   states)
  np.testing.assert_array_equal(after["head"]["kernel"], states[0]["head"]["kernel"])


@pytest.mark.parametrize("momentum", [0.0, 0.6])
def test_fedrep_round_is_head_then_body_heavy_ball_steps(momentum):
  """FedRep with `momentum`: tau - s head steps, then s body steps, each phase a
  heavy-ball run from m = 0 (the reference code's optimizers, restarted per round)."""
  (x, y), = helpers.synthetic_clients((9,), (K,), seed=12)
  states = helpers.client_states((K,), K, seed=4)
  body_steps = 2
  process = _process(helpers.plan("fedrep", TAU + 2, LR, body_steps=body_steps,
                                  momentum=momentum))
  state = process.initialize()
  theta = list(state.model.trainable)
  new_state, (after,), _ = process.next(state, [helpers.as_dataset(x, y)], states)
  model = helpers.keras_model(theta, states[0]["head"], K)
  head, body = model.layers[-1].trainable_variables, model.layers[0].trainable_variables
  _descend(model, head, x, y, TAU + 2 - body_steps, LR, momentum)
  plain_head = head[0].numpy().copy()
  _descend(model, body, x, y, body_steps, LR, momentum)
  np.testing.assert_allclose(after["head"]["kernel"][:, :K], head[0].numpy(), rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(after["head"]["bias"][:K], head[1].numpy(), rtol=1e-5,
                             atol=1e-6)
  for got, want in zip(new_state.model.trainable, body):  # one client: its body
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
  if momentum:  # the momentum matters here (the test can fail)
    gd = helpers.keras_model(theta, states[0]["head"], K)
    _descend(gd, gd.layers[-1].trainable_variables, x, y,
                      TAU + 2 - body_steps, LR, 0.0)
    assert not np.allclose(gd.layers[-1].kernel.numpy(), plain_head, atol=1e-4)


def test_fedbabu_body_takes_heavy_ball_steps_at_its_default_momentum():
  (x, y), = helpers.synthetic_clients((7,), (K,), seed=13)
  fixed = fedbabu.orthogonal_head(200, K, seed=0)
  states = [dict(helpers.client_states((K,), K)[0], head=fixed)]
  plan = helpers.plan("fedbabu", TAU, LR)
  assert plan.phases[0].momentum == 0.9  # config.LOCAL_MOMENTUM, via helpers.plan
  process = _process(plan)
  state = process.initialize()
  theta = list(state.model.trainable)
  new_state, _, _ = process.next(state, [helpers.as_dataset(x, y)], states)
  model = helpers.keras_model(theta, fixed, K)
  _descend(model, model.layers[0].trainable_variables, x, y, 5, LR, 0.9)
  for got, want in zip(new_state.model.trainable, model.layers[0].trainable_variables):
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["fedavg", "fedper"])
def test_local_evaluation_scores_the_locally_trained_model(name):
  """The reference code's protocol: the client's test loss right after its tau steps."""
  (x, y), (xt, yt) = helpers.synthetic_clients((9, 7), (K, K), seed=6)
  process = averaging.build_averaging_process(
      helpers.body_fn, helpers.plan(name, TAU, LR),
      image_shape=helpers.IMAGE_SHAPE, max_classes=K, evaluate_in_round=True)
  state = process.initialize()
  states = helpers.client_states((K,), K)
  data = [collections.OrderedDict(train=helpers.as_dataset(x, y),
                                  test=helpers.as_dataset(xt, yt))]
  _, _, metrics = process.next(state, data, states)
  weights = list(state.model.trainable)
  if name == "fedavg":
    body, head = weights[:-2], dict(kernel=weights[-2], bias=weights[-1])
  else:
    body, head = weights, states[0]["head"]
  trained = _keras_gd(body, head, x, y, TAU, LR)
  local = helpers.keras_model(trained[:-2], dict(kernel=trained[-2], bias=trained[-1]), K)
  broadcast = helpers.keras_model(body, head, K)
  got = metrics["clients"][0]
  np.testing.assert_allclose(got["test_loss"], helpers.loss_fn(local, xt, yt), rtol=1e-5)
  assert not np.isclose(got["test_loss"], helpers.loss_fn(broadcast, xt, yt), rtol=1e-3)
  want_accuracy = np.mean(np.argmax(local(xt).numpy(), -1) == yt)
  assert np.isclose(got["test_accuracy"], want_accuracy) and got["num_test"] == 7
  # Evaluation is no training: the ledger still counts tau passes each way.
  assert (got["body_forward_passes"], got["body_backward_passes"]) == (TAU, TAU)


# Body passes (forward, backward) per client and round at tau = 2 (FedRep: 1 body step).
BODY_PASSES = {"fedavg": (2, 2), "fedprox": (2, 2), "fedper": (2, 2), "fedrep": (2, 1),
               "fedbabu": (5, 5), "fedrecon": (3, 1), "ditto": (4, 4), "local_only": (2, 2),
               "ascd_pfl": (1, 1)}


@pytest.mark.parametrize("name", [n for n in registry.names() if n != "pflego"])
def test_every_baseline_runs_two_rounds_on_real_data(name, prepared, tmp_path):
  passes = BODY_PASSES[name]  # a newly registered baseline must state its passes
  import csv
  from tff_pflego.experiment import ExperimentConfig, run_experiment
  out = tmp_path / name
  summary = run_experiment(ExperimentConfig(
      dataset="fashion_mnist", algorithm=name, num_clients=5, clients_per_round=2,
      rounds=2, local_steps=2, output_dir=str(out), data_dir=prepared, progress=False,
      body_steps=1 if name == "fedrep" else 5))
  assert summary["algorithm"] == name and summary["reports"] == 4
  assert 0.3 < summary["final"]["test_accuracy_mean"] <= 1.0
  with open(out / "rounds.csv") as f:
    rows = list(csv.DictReader(f))
  assert {(float(r["body_forward_passes"]), float(r["body_backward_passes"]))
          for r in rows} == {tuple(map(float, passes))}


def test_cached_head_features_change_no_number_of_a_run_and_resume_either_way(
    prepared, tmp_path):
  from tff_pflego.experiment import ExperimentConfig, run_experiment

  def run(name, rounds, cache):
    return run_experiment(ExperimentConfig(
        dataset="fashion_mnist", algorithm="fedrecon", num_clients=5,
        clients_per_round=2, rounds=rounds, local_steps=3, eval_every=1,
        output_dir=str(tmp_path / name), data_dir=prepared, progress=False,
        cache_head_features=cache))

  published, cached = run("published", 2, False), run("cached", 2, True)
  run("resumed", 1, False)
  resumed = run("resumed", 2, True)  # the fingerprint leaves the cache out
  assert resumed["rounds"] == 2 and 0.3 < published["final"]["test_accuracy_mean"] <= 1
  for summary in (cached, resumed):
    assert summary["final"] == published["final"]
  assert published["body_passes_per_client_round"] == dict(forward=4, backward=1)
  assert cached["body_passes_per_client_round"] == dict(forward=2, backward=1)


def test_ledger_bytes_come_from_the_type_signatures():
  from tff_pflego.training import ledger
  types = _types()
  body = 4 * (16 * 200 + 200)  # Dense(200) on a 4x4x1 input, float32
  head = 4 * (200 * K + K)
  assert ledger.traffic_per_client(types.weights, types.weights.trainable) == dict(
      bytes_down=body, bytes_up=body + 4)  # PFLEGO, FedPer, ...: the body only
  shared = averaging.shared_weights_type(types, helpers.plan("fedavg", TAU, LR))
  assert ledger.traffic_per_client(shared, shared.trainable) == dict(
      bytes_down=body + head, bytes_up=body + head + 4)  # FedAvg: body and head


def test_fedrecon_body_gradient_is_taken_at_the_reconstructed_head():
  import tensorflow_federated as tff
  (x, y), = helpers.synthetic_clients((10,), (K,), seed=10)
  rho = 0.3
  process = averaging.build_averaging_process(
      helpers.body_fn, helpers.plan("fedrecon", TAU, LR),
      image_shape=helpers.IMAGE_SHAPE, max_classes=K,
      server_optimizer=tff.learning.optimizers.build_sgdm(learning_rate=rho))
  state = process.initialize()
  theta = [np.asarray(w) for w in state.model.trainable]
  states = helpers.client_states((K,), K, seed=4)
  new_state, (after,), metrics = process.next(state, [helpers.as_dataset(x, y)], states)

  model = helpers.head_presteps(theta, states[0]["head"], K, x, y, TAU, LR)  # W*
  np.testing.assert_allclose(after["head"]["kernel"], model.layers[-1].kernel.numpy(),
                             rtol=1e-5, atol=1e-6)
  with tf.GradientTape() as tape:
    loss = helpers.loss_fn(model, x, y)
  grads = tape.gradient(loss, model.layers[0].trainable_variables)
  for got, w, g in zip(new_state.model.trainable, theta, grads):
    np.testing.assert_allclose(got, w - rho * g.numpy(), rtol=1e-5, atol=1e-6)
  # At the stored (not reconstructed) head the gradient differs: the test can fail.
  stale = helpers.keras_model(theta, states[0]["head"], K)
  with tf.GradientTape() as tape:
    loss = helpers.loss_fn(stale, x, y)
  g_stale = tape.gradient(loss, stale.layers[0].trainable_variables)[0].numpy()
  assert not np.allclose(g_stale, grads[0].numpy(), atol=1e-5)
  counts = metrics["clients"][0]
  assert (counts["body_forward_passes"], counts["body_backward_passes"]) == (TAU + 1, 1)


@pytest.mark.parametrize("name,body,image_shape,uncached,cached", [
    # tau head steps, then the body gradient
    ("fedrecon", "mlp", helpers.IMAGE_SHAPE, (TAU + 2 + 1, 1), (2, 1)),
    ("fedrecon", "conv4", (28, 28, 1), (TAU + 2 + 1, 1), (2, 1)),
    ("fedrecon", "cifar_cnn", (32, 32, 3), (TAU + 2 + 1, 1), (2, 1)),
    # tau - 2 head steps, then 2 body steps
    ("fedrep", "mlp", helpers.IMAGE_SHAPE, (TAU + 2, 2), (1 + 2, 2)),
    # no head-only phase: the flag changes nothing, and the tables must not claim it did
    ("fedper", "mlp", helpers.IMAGE_SHAPE, (TAU + 2, TAU + 2), (TAU + 2, TAU + 2)),
])
def test_cached_head_features_give_the_same_numbers_with_fewer_body_passes(
    name, body, image_shape, uncached, cached):
  import dataclasses
  import functools
  from tff_pflego.algorithms import registry
  from tff_pflego.models import build_body
  body_fn = functools.partial(build_body, body, image_shape, 3)
  rng = np.random.default_rng(21)
  x = rng.random((11,) + image_shape, np.float32)
  y = rng.integers(0, K, 11).astype(np.int32)
  feature_dim = body_fn().output_shape[-1]
  states = [initial_client_state(0, K, feature_dim, K, 6)]
  plan = helpers.plan(name, TAU + 2, LR, body_steps=2, momentum=0.5)
  rounds = {}
  for cache in (False, True):
    process = averaging.build_averaging_process(
        body_fn, dataclasses.replace(plan, cache_head_features=cache),
        image_shape=image_shape, max_classes=K)
    state = process.initialize()
    new_state, (after,), metrics = process.next(state, [helpers.as_dataset(x, y)], states)
    counts = metrics["clients"][0]
    rounds[cache] = (new_state.model.trainable, after["head"],
                     (counts["body_forward_passes"], counts["body_backward_passes"]))
  for got, want in zip(rounds[True][0], rounds[False][0]):
    np.testing.assert_array_equal(got, want)  # bit for bit
  for part in ("kernel", "bias"):
    np.testing.assert_array_equal(rounds[True][1][part], rounds[False][1][part])
  assert not np.array_equal(rounds[False][1]["kernel"], states[0]["head"]["kernel"])
  assert rounds[False][2] == uncached and rounds[True][2] == cached
  # What results.md labels "(head features cached)": true only where passes were saved.
  saved = rounds[True][2] != rounds[False][2]
  config = helpers.algorithm_config(local_steps=TAU + 2, client_lr=LR, body_steps=2,
                                    momentum=0.5, cache_head_features=True)
  assert registry.head_features_cached(name, config) == saved
  assert not registry.head_features_cached(
      name, dataclasses.replace(config, cache_head_features=False))


def test_ditto_personal_update_is_the_hand_computed_prox_steps():
  (x, y), = helpers.synthetic_clients((8,), (K,), seed=11)
  mu = 0.6
  plan = helpers.plan("ditto", TAU, LR, prox_mu=mu)
  process = _process(plan)
  state = process.initialize()
  global_weights = [np.asarray(w) for w in state.model.trainable]  # body + shared head
  rng = np.random.default_rng(0)
  personal_body = [w + 0.05 * rng.standard_normal(w.shape).astype(np.float32)
                   for w in global_weights[:-2]]
  client = dict(helpers.client_states((K,), K, seed=5)[0], body=personal_body)
  new_state, (after,), metrics = process.next(state, [helpers.as_dataset(x, y)], [client])

  expected = _keras_gd(personal_body, client["head"], x, y, TAU, LR, prox_mu=mu,
                       anchor=global_weights)
  for got, want in zip(list(after["body"]) + [after["head"]["kernel"],
                                               after["head"]["bias"]], expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # ...the prox term pulls toward the global model (the test can fail):
  free = _keras_gd(personal_body, client["head"], x, y, TAU, LR)
  assert not np.allclose(free[0], expected[0], atol=1e-6)
  # The global model is FedAvg's update.
  global_head = dict(kernel=global_weights[-2], bias=global_weights[-1])
  for got, want in zip(new_state.model.trainable,
                       _keras_gd(global_weights[:-2], global_head, x, y, TAU, LR)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  counts = metrics["clients"][0]
  assert (counts["body_forward_passes"], counts["body_backward_passes"]) == (2 * TAU,
                                                                            2 * TAU)


def test_local_only_clients_run_their_own_gd_and_share_nothing():
  """Two rounds of Local-only = 2 tau plain GD steps on each client's own model."""
  from tff_pflego.training import ledger
  data = helpers.synthetic_clients((6, 9), (K, K), seed=12)
  process = _process(helpers.plan("local_only", TAU, LR))
  state = process.initialize()
  rng = np.random.default_rng(1)
  theta = [np.asarray(v) for v in helpers.body_fn().trainable_variables]
  states = [dict(s, body=[w + 0.05 * rng.standard_normal(w.shape).astype(np.float32)
                          for w in theta])
            for s in helpers.client_states((K, K), K, seed=6)]
  datasets = [helpers.as_dataset(*d) for d in data]
  new_state, after, _ = process.next(state, datasets, states)
  new_state, after, metrics = process.next(new_state, datasets, after)
  by_index = {int(s["client_index"]): s for s in after}
  for i, (x, y) in enumerate(data):
    expected = _keras_gd(states[i]["body"], states[i]["head"], x, y, 2 * TAU, LR)
    got = by_index[i]
    for g, w in zip(list(got["body"]) + [got["head"]["kernel"], got["head"]["bias"]],
                    expected):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  # The clients differ (their own data): no averaging happened (the test can fail).
  assert not np.allclose(by_index[0]["body"][0], by_index[1]["body"][0], atol=1e-4)
  shared = process.next.type_signature.parameter[0].member.model
  assert ledger.traffic_per_client(shared, shared.trainable) == dict(bytes_down=0,
                                                                     bytes_up=4)
  assert metrics["train"]["num_clients"] == 2


def test_composition_refuses_stages_that_do_not_fit():
  """As tff.learning's compose_learning_process: an aggregator built for FedAvg's body
  and head cannot take FedPer's body-only update."""
  import tensorflow_federated as tff
  from tff_pflego import aggregators
  from tff_pflego.algorithms import composition
  types = _types()
  work = averaging.build_client_work(helpers.body_fn, helpers.plan("fedper", TAU, LR), types)
  distributor = tff.learning.templates.build_broadcast_process(types.weights)
  finalizer = tff.learning.templates.build_apply_optimizer_finalizer(
      tff.learning.optimizers.build_sgdm(1.0), types.weights)

  @tff.tensorflow.computation
  def initial():
    return tff.learning.models.ModelWeights.from_model(helpers.body_fn())

  def aggregator_for(value_type):
    return aggregators.build_mean_aggregator(value_type)

  fedavg_shared = averaging.shared_weights_type(types, helpers.plan("fedavg", TAU, LR))
  with pytest.raises(composition.StagesDoNotFit, match="but the aggregator takes"):
    composition.compose_process(initial, distributor, work,
                                aggregator_for(fedavg_shared.trainable), finalizer,
                                types.dataset, types.client_state)
  composition.compose_process(initial, distributor, work,
                              aggregator_for(types.weights.trainable), finalizer,
                              types.dataset, types.client_state)


@pytest.mark.parametrize("name", registry.names())
def test_a_round_draws_no_random_numbers_for_weights_it_overwrites(name):
  # Every call of a TFF computation runs its variables' initializers: the clients'
  # bodies, assigned the broadcast weights before use, are built at zero
  # (`build_body(initialize=False)`). ASCD-PFL's server draws its K: one uniform, in
  # each of a fused round's two server computations (`stages.SplitDistributor`).
  ops = inspection.tensorflow_ops(
      registry.build_algorithm(name, helpers.algorithm_config()).process.next)
  draws = {op: n for op, n in ops.items() if "Random" in op or "Normal" in op}
  assert draws == ({"StatelessRandomGetKeyCounter": 2, "StatelessRandomUniformV2": 2}
                   if name == "ascd_pfl" else {})
