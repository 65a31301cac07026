"""The clients' metrics leave the TFF runtime as one float64 vector per client.

A round's `next` returns, beside the server state and the clients' states, each
sampled client's metrics: a struct of scalars (loss, accuracy, counts, timings). The
runtime hands every tensor of a result to Python as its own protobuf message, so at
r = 20 clients of ~10 scalars each a round deserializes ~200 messages on its critical
path. `with_packed_client_metrics` wraps `next` so that, still inside the runtime, each
client's metrics become one vector

  packed_i = concat(float64(m_i1), ..., float64(m_ik))    (the leaves in type order)

and `unpack` turns the vectors back into the structs the process returns, each leaf
cast to its own dtype. float64 holds every float16, float32, bool and 8- to 32-bit
integer value exactly, so for those the unpacked metrics are the process's own, bit
for bit. A process whose client metrics hold anything else (64-bit integers, which
float64 does not hold beyond 2^53; strings; nested structs; shapes not fully known)
is returned unwrapped, with an `unpack` that is the identity; so is a process whose
metrics hold anything beside `train` and `clients`, which the wrapper would drop.

The wrapped process is the driver's (and the benchmarks', which time its round);
`algorithm.process`, the public one, keeps its types. Measured: 3–21 ms less a round
for PFLEGO at r = 20 on 2 cores (`binaries/benchmark_round_transfer.py`); packing the
clients' states the same way gained nothing. `unpacking_next`, the driver's round,
also moves the server state flat (`flat_server_state`).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.algorithms import flat_server_state

# Dtypes whose every value float64 represents exactly.
_EXACT_IN_FLOAT64 = tuple(np.dtype(d) for d in (
    np.float64, np.float32, np.float16, np.int32, np.int16, np.int8, np.uint8,
    np.uint16, np.uint32, np.bool_))


def _leaves(metrics_type: tff.types.Type) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
  """(name, dtype, shape) of each tensor of a flat struct type, or [] if the type is
  not a flat struct of fully defined tensors that float64 holds exactly."""
  if not isinstance(metrics_type, tff.types.StructType):
    return []
  leaves = []
  for name, element in tff.structure.iter_elements(metrics_type):
    if (name is None or not isinstance(element, tff.types.TensorType)
        or np.dtype(element.dtype) not in _EXACT_IN_FLOAT64
        or element.shape is None or any(d is None for d in element.shape)):
      return []
    leaves.append((name, np.dtype(element.dtype), tuple(element.shape)))
  return leaves


def _is_train_and_clients(metrics_type: tff.types.Type) -> bool:
  """Whether the metrics are exactly {train, clients}: the only form the wrapped `next`
  rebuilds, so no other metric is dropped by packing."""
  return (isinstance(metrics_type, tff.types.StructType)
          and [name for name, _ in tff.structure.iter_elements(metrics_type)]
          == ["train", "clients"])


def _unpacker(leaves: Sequence[tuple[str, np.dtype, tuple[int, ...]]], container
              ) -> Callable[[Sequence[np.ndarray]], list]:
  sizes = [int(np.prod(shape)) for _, _, shape in leaves]
  ends = np.cumsum(sizes)

  def unpack_one(vector: np.ndarray):
    values = {}
    for (name, dtype, shape), end, size in zip(leaves, ends, sizes):
      value = np.asarray(vector[end - size:end]).astype(dtype).reshape(shape)
      values[name] = value[()] if not shape else value
    return container(values)

  return lambda packed: [unpack_one(np.asarray(v)) for v in packed]


def with_packed_client_metrics(process: tff.templates.IterativeProcess
                               ) -> tuple[tff.templates.IterativeProcess,
                                          Callable[[Any], Any]]:
  """(process whose `metrics["clients"]` are packed vectors, unpack) for a process
  `next(state, data, client_states) -> (state, client_states, metrics)` with
  `metrics = {train @SERVER, clients @CLIENTS}`; `unpack(metrics)` returns the metrics
  `process.next` would have returned."""
  state_type, data_type, client_states_type = process.next.type_signature.parameter
  metrics_type = process.next.type_signature.result[2]
  clients_type = (metrics_type.clients if _is_train_and_clients(metrics_type)
                  else None)
  leaves = (_leaves(clients_type.member)
            if isinstance(clients_type, tff.types.FederatedType) else [])
  if not leaves:
    return process, lambda metrics: metrics

  @tff.tensorflow.computation(clients_type.member)
  def pack(metrics):
    return tf.concat([tf.reshape(tf.cast(metrics[name], tf.float64), [-1])
                      for name, _, _ in leaves], axis=0)

  @tff.federated_computation(state_type, data_type, client_states_type)
  def next_fn(state, data, client_states):
    new_state, new_client_states, metrics = process.next(state, data, client_states)
    return new_state, new_client_states, collections.OrderedDict(
        train=metrics.train, clients=tff.federated_map(pack, metrics.clients))

  container = clients_type.member.python_container or collections.OrderedDict
  unpack_clients = _unpacker(leaves, container)

  def unpack(metrics):
    return collections.OrderedDict(train=metrics["train"],
                                   clients=unpack_clients(metrics["clients"]))

  return tff.templates.IterativeProcess(process.initialize, next_fn), unpack


def unpacking_next(process: tff.templates.IterativeProcess) -> Callable:
  """`next(state, data, client_states)` returning what `process.next` returns, its
  clients' metrics packed in the runtime and unpacked in Python (module docstring),
  its server state crossing the runtime's boundary flat (`flat_server_state`)."""
  flat, flatten, unflatten = flat_server_state.with_flat_server_state(process)
  packed, unpack = with_packed_client_metrics(flat)

  def next_fn(state, data, client_states):
    new_state, new_client_states, metrics = packed.next(flatten(state), data,
                                                         client_states)
    return unflatten(new_state), new_client_states, unpack(metrics)

  return next_fn
