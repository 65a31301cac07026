"""Bodies and heads."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tff_pflego.models import build_body, heads


@pytest.mark.parametrize("name,shape,m", [("mlp", (28, 28, 1), 200),
                                          ("cifar_cnn", (32, 32, 3), 192),
                                          ("conv4", (28, 28, 1), 64)])
def test_body_plus_head_equals_one_keras_model(name, shape, m):
  body = build_body(name, shape, seed=0)
  assert body.output_shape[-1] == m
  head = tf.keras.layers.Dense(5)
  model = tf.keras.Sequential([body, head])
  x = np.random.default_rng(0).random((3,) + shape).astype(np.float32)
  logits = model(x)
  ours = heads.head_logits(body(x), head.kernel, head.bias)
  np.testing.assert_allclose(ours, logits, atol=1e-5)


def test_masked_padded_head_equals_small_head():
  rng = np.random.default_rng(1)
  features = tf.constant(rng.normal(size=(6, 8)).astype(np.float32))
  y = tf.constant([0, 1, 2, 1, 0, 2])
  kernel = tf.constant(rng.normal(size=(8, 5)).astype(np.float32))
  bias = tf.constant(rng.normal(size=(5,)).astype(np.float32))
  mask = heads.class_mask(3, 5)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([kernel, bias])
    padded, acc_padded = heads.head_loss_and_accuracy(features, y, kernel, bias, mask)
    small, acc_small = heads.head_loss_and_accuracy(features, y, kernel[:, :3], bias[:3])
  np.testing.assert_allclose(padded, small, rtol=1e-6)
  assert float(acc_padded) == float(acc_small)
  g_padded = tape.gradient(padded, kernel).numpy()
  g_small = tape.gradient(small, kernel).numpy()
  np.testing.assert_allclose(g_padded[:, :3], g_small[:, :3], atol=1e-6)
  assert np.all(g_padded[:, 3:] == 0)


def test_full_batch_concatenates_batches_in_order_and_keeps_empty_shapes():
  from tff_pflego.data.batching import full_batch
  x = np.arange(30, dtype=np.float32).reshape(10, 3)
  y = np.arange(10, dtype=np.int32)
  batched = tf.data.Dataset.from_tensor_slices({"x": x, "y": y}).batch(4)  # 4 + 4 + 2
  whole = full_batch(batched)
  np.testing.assert_array_equal(whole["x"], x)
  np.testing.assert_array_equal(whole["y"], y)
  empty = full_batch(batched.take(0))
  assert empty["x"].shape == (0, 3) and empty["y"].shape == (0,)


@pytest.mark.parametrize("name,shape", [("mlp", (28, 28, 1)), ("cifar_cnn", (32, 32, 3)),
                                        ("conv4", (28, 28, 1))])
def test_a_body_built_for_assignment_is_the_same_body_at_zero(name, shape):
  seeded, for_assignment = build_body(name, shape, seed=0), build_body(
      name, shape, initialize=False)
  assert [type(layer) for layer in seeded.layers] == [
      type(layer) for layer in for_assignment.layers]
  assert [v.shape for v in seeded.variables] == [v.shape for v in for_assignment.variables]
  assert all(not np.any(v.numpy()) for v in for_assignment.variables)
  assert all(np.any(v.numpy()) for v in seeded.variables)
  for_assignment.set_weights(seeded.get_weights())
  x = np.random.default_rng(0).random((2,) + shape).astype(np.float32)
  np.testing.assert_array_equal(for_assignment(x), seeded(x))
