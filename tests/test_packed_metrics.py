"""The driver's round (clients' metrics packed in the runtime, unpacked in Python; the
server state flat across the runtime's boundary) returns what the algorithm's own `next`
returns, value for value and type for type."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import helpers
from tff_pflego.algorithms import flat_server_state, packed_metrics, registry

SIZES, NUM_CLASSES = (5, 8, 11), (2, 3, 3)


def _without_timings(clients):
  return [collections.OrderedDict((k, v) for k, v in c.items()
                                  if k not in helpers.TIMING_COLUMNS) for c in clients]


def _leaf_types(structure) -> list:
  return [(type(v), getattr(v, "dtype", None), np.shape(v))
          for v in tf.nest.flatten(structure)]


@pytest.mark.parametrize("name, server_optimizer", [("pflego", "adam"),
                                                    ("fedrecon", "sgd")])
def test_unpacked_round_is_the_process_round(name, server_optimizer):
  algorithm = registry.build_algorithm(
      name, helpers.algorithm_config(server_optimizer=server_optimizer))
  packed, _ = packed_metrics.with_packed_client_metrics(algorithm.process)
  leaves = list(tff.structure.iter_elements(
      algorithm.process.next.type_signature.result[2].clients.member))
  assert packed.next.type_signature.result[2].clients.member == tff.TensorType(
      np.float64, (len(leaves),))
  next_round = packed_metrics.unpacking_next(algorithm.process)
  data = [helpers.as_dataset(x, y) for x, y in
          helpers.synthetic_clients(SIZES, NUM_CLASSES, seed=3)]
  if algorithm.evaluates_in_round:
    data = [collections.OrderedDict(train=d, test=d) for d in data]
  states = [algorithm.initial_client_state(i, k) for i, k in enumerate(NUM_CLASSES)]
  state = algorithm.process.initialize()
  for _ in range(2):
    want = algorithm.process.next(state, data, states)
    got = next_round(state, data, states)
    tf.nest.map_structure(np.testing.assert_array_equal, got[:2], want[:2])
    assert _leaf_types(got[:2]) == _leaf_types(want[:2])
    tf.nest.map_structure(np.testing.assert_array_equal, got[2]["train"],
                          want[2]["train"])
    got_clients, want_clients = (_without_timings(m[2]["clients"]) for m in (got, want))
    assert got_clients == want_clients  # the same keys, in order, and values
    for g, w in zip(got_clients, want_clients):
      assert [type(v) for v in g.values()] == [type(v) for v in w.values()]
    assert [list(c) for c in got[2]["clients"]] == [list(c) for c in want[2]["clients"]]
    state, states = want[0], want[1]
  assert len({float(c["loss"]) for c in want_clients}) == len(SIZES)  # not all alike
  floats = [v for v in tf.nest.flatten(state) if np.asarray(v).dtype == np.float32]
  assert len({float(np.sum(v)) for v in floats}) == len(floats)  # a swap would show


def test_the_server_state_crosses_flat_and_comes_back_nested():
  algorithm = registry.build_algorithm(
      "pflego", helpers.algorithm_config(server_optimizer="adam"))
  flat, flatten, unflatten = flat_server_state.with_flat_server_state(algorithm.process)
  state_type = algorithm.process.next.type_signature.parameter[0].member
  flat_type = flat.next.type_signature.parameter[0].member
  assert all(isinstance(t, tff.TensorType) for t in flat_type)
  assert list(flat_type) == tff.structure.flatten(state_type)
  assert flat.next.type_signature.result[0] == flat.next.type_signature.parameter[0]
  state = algorithm.process.initialize()
  assert len(state.finalizer) > 1  # Adam's moments: the deep part of the state
  for value in (flat.initialize(), flatten(state)):
    got = unflatten(value)
    assert type(got) is type(state)
    tf.nest.map_structure(np.testing.assert_array_equal, got, state)
    assert _leaf_types(got) == _leaf_types(state)


def test_a_process_without_a_server_state_struct_is_not_wrapped():
  process = _toy_process(["train", "clients"])  # state: a float32 @SERVER
  unwrapped, flatten, unflatten = flat_server_state.with_flat_server_state(process)
  assert unwrapped is process
  assert flatten(np.float32(2.0)) == unflatten(np.float32(2.0)) == np.float32(2.0)


def test_metrics_float64_cannot_hold_exactly_are_not_packed():
  exact = tff.types.StructWithPythonType(
      [("loss", np.float32), ("count", np.int32),
       ("pair", tff.TensorType(np.float32, (2,)))], collections.OrderedDict)
  assert [dtype for _, dtype, _ in packed_metrics._leaves(exact)] == [
      np.float32, np.int32, np.float32]
  for inexact in ([("loss", np.float32), ("big", np.int64)],
                  [("loss", np.float32), ("name", np.str_)],
                  [("loss", np.float32),
                   ("ragged", tff.TensorType(np.float32, (None,)))]):
    assert packed_metrics._leaves(tff.types.StructWithPythonType(
        inexact, collections.OrderedDict)) == []


def test_unpack_restores_dtypes_shapes_and_values():
  leaves = [("index", np.dtype(np.int32), ()), ("loss", np.dtype(np.float32), ()),
            ("pair", np.dtype(np.float32), (2,))]
  loss, pair = np.float32(0.1), np.array([1e-8, 3.3], np.float32)
  vector = np.concatenate([[2**31 - 1], [loss], pair]).astype(np.float64)
  (got,) = packed_metrics._unpacker(leaves, collections.OrderedDict)([vector])
  assert list(got) == ["index", "loss", "pair"]
  assert type(got["index"]) is np.int32 and got["index"] == 2**31 - 1
  assert type(got["loss"]) is np.float32 and got["loss"] == loss
  assert got["pair"].dtype == np.float32 and np.array_equal(got["pair"], pair)


def _toy_process(metric_names):
  """A process whose metrics are `metric_names`, each the server state except
  `clients`: one {loss} struct per client."""
  server_float = tff.FederatedType(np.float32, tff.SERVER)
  clients_float = tff.FederatedType(np.float32, tff.CLIENTS)

  @tff.tensorflow.computation(np.float32)
  def as_metrics(x):
    return collections.OrderedDict(loss=x)

  @tff.federated_computation
  def initialize():
    return tff.federated_value(np.float32(0.0), tff.SERVER)

  @tff.federated_computation(server_float, clients_float, clients_float)
  def next_fn(state, data, client_states):
    metrics = collections.OrderedDict(
        (name, tff.federated_map(as_metrics, data) if name == "clients" else state)
        for name in metric_names)
    return state, client_states, metrics

  return tff.templates.IterativeProcess(initialize, next_fn)


def test_metrics_beside_train_and_clients_are_kept_unpacked():
  packable = _toy_process(["train", "clients"])
  packed, unpack = packed_metrics.with_packed_client_metrics(packable)
  assert packed is not packable
  state = packable.initialize()
  data = [np.float32(1.5), np.float32(-2.0)]
  got = unpack(packed.next(state, data, data)[2])
  assert [c["loss"] for c in got["clients"]] == data
  for extra in (["train", "clients", "extra"], ["clients", "train"]):
    process = _toy_process(extra)
    unwrapped, unpack = packed_metrics.with_packed_client_metrics(process)
    assert unwrapped is process
    metrics = process.next(state, data, data)[2]
    assert list(unpack(metrics)) == extra
