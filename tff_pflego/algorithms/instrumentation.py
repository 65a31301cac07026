"""What a client computation measures about itself: body passes and time.

Both are measured as the computation runs (not as the code is written) and reported
in the client's metrics; `training.ledger` turns them into the cost columns.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, NamedTuple, Sequence

import tensorflow as tf

from tff_pflego.data.batching import full_batch


class BodyPassCounter(tf.Module):
  """Counts body forward and backward passes as they run (not as written).

  `counted_call(body, x)` runs the body and adds one to `forward`; when a gradient
  flows back through its output, one is added to `backward`. The variables live in the
  client computation, so the counts are per client and per round.
  """

  def __init__(self):
    super().__init__(name="body_pass_counter")
    self.forward = tf.Variable(0, dtype=tf.int32, trainable=False, name="forward")
    self.backward = tf.Variable(0, dtype=tf.int32, trainable=False, name="backward")

  def counted_call(self, body: tf.keras.Model, x: tf.Tensor) -> tf.Tensor:
    with tf.control_dependencies([self.forward.assign_add(1)]):
      features = body(x, training=False)

    @tf.custom_gradient
    def count_backward(f):
      def grad(upstream):
        with tf.control_dependencies([self.backward.assign_add(1)]):
          return tf.identity(upstream)
      return tf.identity(f), grad

    return count_backward(features)

  def counts(self) -> collections.OrderedDict:
    return collections.OrderedDict(body_forward_passes=self.forward.read_value(),
                                   body_backward_passes=self.backward.read_value())


DATA_LOADED_AT = "data_loaded_at"


def load_full_batch(dataset: tf.data.Dataset, metrics_out: dict) -> collections.OrderedDict:
  """`full_batch(dataset)`, noting in `metrics_out` when the data was in memory."""
  batch = full_batch(dataset)
  with tf.control_dependencies(tf.nest.flatten(batch)):
    metrics_out[DATA_LOADED_AT] = tf.timestamp()
  return batch


def timed(update: Callable) -> Callable:
  """Wraps a client update: its metrics gain, measured by tf.timestamp,

    client_time_s     the whole client computation, reading its data included;
    client_compute_s  from its data being in memory (`load_full_batch`) to the end:
                      the algorithm's own cost, without the simulation's file reads.
  """

  def timed_update(*args):
    start = tf.timestamp()
    with tf.control_dependencies([start]):
      output = update(*args)
    with tf.control_dependencies(tf.nest.flatten(output)):
      end = tf.timestamp()
    metrics = output["metrics"]
    loaded = metrics.pop(DATA_LOADED_AT, start)
    metrics["client_time_s"] = tf.cast(end - start, tf.float32)
    metrics["client_compute_s"] = tf.cast(end - loaded, tf.float32)
    return output

  return timed_update


class RoundSplit(NamedTuple):
  """Where a round's wall time went, clients run one computation at a time."""
  data_s: float              # sum_i (client_time_s_i - client_compute_s_i)
  compute_s: float           # sum_i client_compute_s_i
  outside_clients_s: float   # round_s - sum_i client_time_s_i


def split_round(round_s: float, client_time_s: Sequence[float],
                client_compute_s: Sequence[float]) -> RoundSplit:
  """Splits a round of `round_s` seconds by its clients' `timed` metrics:

    round_s = data_s + compute_s + outside_clients_s.

  Valid only for clients computed one at a time, each compute time within its
  client's time (0 <= client_compute_s_i <= client_time_s_i). Overlapping clients
  are refused when their times sum past the round, the only overlap these sums show.
  """
  if len(client_time_s) != len(client_compute_s):
    raise ValueError(f"{len(client_time_s)} client times but "
                     f"{len(client_compute_s)} compute times")
  if any(c < 0.0 for c in client_compute_s):
    raise ValueError("a client's compute time is negative")
  if any(c > w for c, w in zip(client_compute_s, client_time_s)):
    raise ValueError("a client's compute time is longer than its whole time")
  whole, compute = math.fsum(client_time_s), math.fsum(client_compute_s)
  if whole > round_s:
    raise ValueError(f"clients' times (sum {whole:.6g} s) do not fit one after another "
                     f"in a {round_s:.6g} s round: they overlapped")
  return RoundSplit(data_s=whole - compute, compute_s=compute,
                    outside_clients_s=round_s - whole)
