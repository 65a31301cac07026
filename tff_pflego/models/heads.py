"""Personal linear heads: logits z = phi W + b, W in R^{M x K}, b in R^K.

TFF gives every client's head one type, so heads are stored padded to K_max classes;
`class_mask` removes the absent classes (K_i <= k < K_max) from the softmax by setting
their logits to a large negative number. Their probabilities are then exactly 0, their
rows of W get zero gradient, and loss, accuracy and gradients equal those of a K_i-sized
head.
"""

from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

MASKED_LOGIT = -1e9


def initial_head(feature_dim: int, max_classes: int, rng: np.random.Generator
                 ) -> collections.OrderedDict:
  """PyTorch's Linear default, U(+-1/sqrt(M)) for kernel and bias (see models.bodies)."""
  limit = 1.0 / np.sqrt(feature_dim)
  return collections.OrderedDict(
      kernel=rng.uniform(-limit, limit, (feature_dim, max_classes)).astype(np.float32),
      bias=rng.uniform(-limit, limit, max_classes).astype(np.float32))


def class_mask(num_classes: tf.Tensor, max_classes: int) -> tf.Tensor:
  """Boolean [max_classes]: True for the client's own classes 0..K_i-1."""
  return tf.range(max_classes) < tf.cast(num_classes, tf.int32)


def head_logits(features: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor,
                mask: tf.Tensor | None = None) -> tf.Tensor:
  logits = tf.matmul(features, kernel) + bias
  if mask is None:
    return logits
  return tf.where(mask[tf.newaxis, :], logits, tf.constant(MASKED_LOGIT, logits.dtype))


def head_loss_and_accuracy(features: tf.Tensor, labels: tf.Tensor, kernel: tf.Tensor,
                           bias: tf.Tensor, mask: tf.Tensor | None = None
                           ) -> tuple[tf.Tensor, tf.Tensor]:
  """Mean cross-entropy l_i and accuracy of the head on (features, labels)."""
  logits = head_logits(features, kernel, bias, mask)
  loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
  correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels),
                    tf.float32)
  return loss, tf.reduce_mean(correct)
