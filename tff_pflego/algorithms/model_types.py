"""TFF types of a body + padded head model, and a client's first state.

Every algorithm's client receives the shared weights, its dataset (one full batch) and
its personal *client state*:

    {client_index: int32, num_classes: int32 (K_i),
     head: {kernel: float32[M, K_max], bias: float32[K_max]},
     body: the body's trainable weights        (only with a personal body)}

and returns its new client state with the same `client_index`, so the driver can
match results to clients whatever order a (multi-worker) runtime returns them in.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.models import heads

# body_fn() builds the body with its seeded initial weights; body_fn(initialize=False)
# the same body at zero, for computations that assign its weights before use
# (`tff_pflego.models.bodies.build_body`).
BodyFn = Callable[..., tf.keras.Model]


@dataclasses.dataclass(frozen=True)
class ModelTypes:
  """TFF types of one body + padded head configuration."""
  weights: tff.types.Type  # tff.learning.models.ModelWeights of the body
  dataset: tff.SequenceType  # {x: float32[n, H, W, C], y: int32[n]}*
  client_state: tff.types.Type
  feature_dim: int
  max_classes: int


def model_types(body_fn: BodyFn, image_shape: tuple, max_classes: int,
                personal_body: bool = False) -> ModelTypes:
  """Derives the TFF types by building the body once in a throw-away graph.

  With `personal_body` (Ditto, Local-only), the client state also holds the client's own body
  (`body`: the trainable weights) beside its head.
  """
  with tf.Graph().as_default():
    body = body_fn(initialize=False)
    weights = tff.learning.models.ModelWeights.from_model(body)
    weights_type = tff.types.tensorflow_to_type(
        tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), weights))
    feature_dim = int(body.output_shape[-1])
  dataset_type = tff.SequenceType(collections.OrderedDict(
      x=tff.TensorType(np.float32, (None,) + tuple(image_shape)),
      y=tff.TensorType(np.int32, (None,))))
  state = collections.OrderedDict(
      client_index=np.int32, num_classes=np.int32,
      head=collections.OrderedDict(
          kernel=tff.TensorType(np.float32, (feature_dim, max_classes)),
          bias=tff.TensorType(np.float32, (max_classes,))))
  if personal_body:
    state["body"] = weights_type.trainable
  client_state_type = tff.types.to_type(state)
  return ModelTypes(weights_type, dataset_type, client_state_type, feature_dim,
                    max_classes)


def train_and_test_type(types: ModelTypes) -> tff.types.StructWithPythonType:
  """A client's train and test datasets together: OrderedDict(train=..., test=...)."""
  return tff.types.StructWithPythonType(
      [("train", types.dataset), ("test", types.dataset)], collections.OrderedDict)


def initial_client_state(client_index: int, num_classes: int, feature_dim: int,
                         max_classes: int, seed: int) -> collections.OrderedDict:
  """A client's state on its first visit: a fresh head (`heads.initial_head`),
  seeded by (seed, i)."""
  rng = np.random.default_rng([seed, client_index])
  return collections.OrderedDict(
      client_index=np.int32(client_index), num_classes=np.int32(num_classes),
      head=heads.initial_head(feature_dim, max_classes, rng))
