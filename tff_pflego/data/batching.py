"""A client's whole dataset as one batch (every algorithm here takes full-batch steps)."""

from __future__ import annotations

import collections

import tensorflow as tf

_ALL_EXAMPLES = 1 << 30


def full_batch(dataset: tf.data.Dataset) -> collections.OrderedDict:
  """Concatenates all batches of a client dataset into one batch (full-batch GD).

  Re-batched in tf.data and taken as one element (an empty dataset gives empty
  tensors): ~4 ms for 600 Fashion-MNIST examples, where `Dataset.reduce` with concat
  took ~20 ms, most of it per-call overhead.
  """
  empty = tf.nest.map_structure(
      lambda s: tf.zeros((0,) + tuple(s.shape[1:]), s.dtype), dataset.element_spec)
  whole = dataset.unbatch().batch(_ALL_EXAMPLES)
  return whole.concatenate(tf.data.Dataset.from_tensors(empty)).take(1).get_single_element()
