"""Scores of a body + head model on a client's whole dataset."""

from __future__ import annotations

import tensorflow as tf

from tff_pflego.data.batching import full_batch
from tff_pflego.models import heads


def score_on_dataset(body: tf.keras.Model, dataset: tf.data.Dataset, head,
                     mask: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """(mean loss, accuracy, number of examples) of body + head on all of `dataset`.

  The body runs in inference mode; `head` is {"kernel", "bias"} and `mask` marks the
  client's own classes (`heads.class_mask`).
  """
  batch = full_batch(dataset)
  loss, accuracy = heads.head_loss_and_accuracy(
      body(batch["x"], training=False), batch["y"], head["kernel"], head["bias"], mask)
  return loss, accuracy, tf.shape(batch["y"])[0]
