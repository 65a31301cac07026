"""Every random draw of a unified run, stateless: a function of (seed, round, device).

A run is reproducible from its seed alone, and a draw does not depend on which process,
worker or order computed it:
  schedule  the server's draw of a round's iterations: K local (beta) iterations, then
            the communicating one, and whether it steps w and/or refreshes the
            reference point (stream 1, folded with the round);
  examples  device m's example index j for each iteration of the round (stream 0,
            folded with the round and the device), uniform over its n examples;
  cohort    with partial participation, the round's r of the M devices, uniformly
            without replacement (stream 2, folded with the round).
"""

from __future__ import annotations

import math

import tensorflow as tf

EXAMPLE_STREAM, SCHEDULE_STREAM, COHORT_STREAM = 0, 1, 2


def _key(seed: int, stream: int, *data: tf.Tensor) -> tf.Tensor:
  key = tf.constant([seed, stream], tf.int64)
  for value in data:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(value, tf.int64))
  return key


def example_indices(seed: int, round_num: tf.Tensor, device: tf.Tensor, count: tf.Tensor,
                    num_examples: int) -> tf.Tensor:
  """[count] indices in [0, num_examples) for `device` in round `round_num`."""
  return tf.random.stateless_uniform(
      tf.reshape(count, [1]), _key(seed, EXAMPLE_STREAM, round_num, device),
      minval=0, maxval=num_examples, dtype=tf.int32)


def round_schedule(seed: int, round_num: tf.Tensor, p_w: float, rho: float,
                   refreshes: bool) -> dict:
  """The iterations one communication covers.

  Each iteration steps w with probability p_w (else beta) and, with `refreshes`,
  refreshes the reference point with probability rho; it communicates when it steps w
  or refreshes, i.e. with probability q = p_w + rho (1 - p_w) (q = p_w without
  refreshes). So a round is K ~ Geometric(q) - 1 local iterations (P(K = k) =
  (1-q)^k q, by inversion) and one communicating iteration, which given that it
  communicates is (w, no refresh) w.p. p_w (1 - rho) / q, (w, refresh) p_w rho / q and
  (beta, refresh) (1 - p_w) rho / q.
  """
  q = p_w + rho * (1 - p_w) if refreshes else p_w
  u = tf.random.stateless_uniform([2], _key(seed, SCHEDULE_STREAM, round_num),
                                  dtype=tf.float64)
  if q >= 1:
    local = tf.constant(0, tf.int32)
  else:
    # 1 - u is in (0, 1], so the log is finite.
    local = tf.cast(tf.floor(tf.math.log1p(-u[0]) / math.log1p(-q)), tf.int32)
  if not refreshes:
    return dict(local_steps=local, step_w=tf.constant(True), refresh=tf.constant(False))
  r = u[1] * q
  return dict(local_steps=local, step_w=r < p_w, refresh=r >= p_w * (1 - rho))


def cohort(seed: int, round_num: int, num_devices: int, size: int) -> list[int]:
  """The `size` devices (sorted) taking part in round `round_num`: the first `size` of
  a uniformly random permutation, so each device is in with probability size / M."""
  keys = tf.random.stateless_uniform([num_devices], _key(seed, COHORT_STREAM, round_num),
                                     dtype=tf.float64)
  return sorted(int(i) for i in tf.argsort(keys)[:size].numpy())
