"""A fused round (`stages.py`) is the composed one, bit for bit, in fewer intrinsics."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tff_pflego.algorithms import inspection, registry, stages

SIZES, NUM_CLASSES = (5, 8, 11), (2, 3, 3)


def _rounds(algorithm, num_rounds: int = 3):
  data = helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=7)
  datasets = [helpers.as_dataset(x, y) for x, y in data]
  if algorithm.evaluates_in_round:
    datasets = [collections.OrderedDict(train=d, test=d) for d in datasets]
  states = [algorithm.initial_client_state(i, k) for i, k in enumerate(NUM_CLASSES)]
  state, outputs = algorithm.process.initialize(), []
  for _ in range(num_rounds):
    state, states, metrics = algorithm.process.next(state, datasets, states)
    clients = [{k: v for k, v in m.items() if k not in helpers.TIMING_COLUMNS}
               for m in metrics["clients"]]
    outputs.append((state, states, metrics["train"], clients))
  return outputs


@pytest.mark.parametrize("name", registry.names())
def test_fused_round_is_the_composed_round_bit_for_bit(name, monkeypatch):
  config = helpers.algorithm_config(server_optimizer="adam")
  fused = registry.build_algorithm(name, config)
  monkeypatch.setattr(stages, "is_split", lambda *stages_: False)
  composed = registry.build_algorithm(name, config)
  assert sum(inspection.count_intrinsics(fused.process.next).values()) == 12
  assert sum(inspection.count_intrinsics(composed.process.next).values()) > 30
  for got, want in zip(_rounds(fused), _rounds(composed)):
    tf.nest.map_structure(np.testing.assert_array_equal, got, want)
  # The rounds moved the model or the heads (the comparison is not of initial values).
  moved = lambda output: tf.nest.flatten((output[0].model, output[1]))
  assert not all(np.array_equal(a, b) for a, b in zip(moved(_rounds(fused, 1)[0]),
                                                       moved(_rounds(fused)[-1])))


@pytest.mark.parametrize("poison", [None, np.nan, np.inf])
def test_optimizer_finalizer_is_tff_learnings(poison):
  weights_type = tff.types.to_type(tff.learning.models.ModelWeights(
      trainable=[tff.TensorType(np.float32, (3, 2)), tff.TensorType(np.float32, (2,))],
      non_trainable=[tff.TensorType(np.float32, (2,))]))
  optimizer = tff.learning.optimizers.build_adam(0.01)
  ours = stages.optimizer_finalizer(optimizer, weights_type)
  theirs = tff.learning.templates.build_apply_optimizer_finalizer(optimizer, weights_type)
  rng = np.random.default_rng(3)
  weights = tff.learning.models.ModelWeights(
      trainable=[rng.normal(size=(3, 2)).astype(np.float32),
                 rng.normal(size=2).astype(np.float32)],
      non_trainable=[rng.normal(size=2).astype(np.float32)])
  state = {"ours": ours.initialize(), "theirs": theirs.initialize()}
  outputs = {}
  for step in range(3):
    update = [rng.normal(size=(3, 2)).astype(np.float32),
              rng.normal(size=2).astype(np.float32)]
    if poison is not None and step == 1:
      update[1][0] = poison
    for key, finalizer in (("ours", ours), ("theirs", theirs)):
      out = finalizer.next(state[key], weights, update)
      state[key] = out.state
      outputs[key] = (out.state, out.result, out.measurements)
    tf.nest.map_structure(np.testing.assert_array_equal, outputs["ours"],
                          outputs["theirs"])
    assert int(outputs["ours"][2]["update_non_finite"]) == int(
        poison is not None and step == 1)
    weights = outputs["ours"][1]
