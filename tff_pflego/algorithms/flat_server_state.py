"""The server state crosses the TFF runtime's boundary as a flat list of tensors.

Every round the driver hands `next` the server state and gets the new one back. TFF
0.87 (de)serializes a struct level by level and protobuf copies a message passed to a
constructor, so a tensor k struct levels deep is copied about 2k times; the body and
the server optimizer's moments sit four levels deep (ServerState -> finalizer ->
moments -> list), and the 1.9 MB state of PFLEGO's MLP took 22 ms of a round where the
same tensors in one flat list took 4 ms (docs/round_profile.md, "Fifth look").

`with_flat_server_state` wraps `next` so that its state goes in and comes out as the
list of the state's tensors in type order,

  flat = [leaf_1, ..., leaf_n]    (tff.structure.flatten of the state),

nested and flattened again inside the runtime by two TensorFlow computations on the
server that only rename tensors, and in Python by `flatten` / `unflatten`, which move
no bytes. The state a round returns is therefore `next`'s own, value for value and
type for type; `algorithm.process`, the public one, keeps its types. Measured with
`binaries/benchmark_round_transfer.py`: 11–17 ms less a PFLEGO round at r = 20 on 2
cores (median of the rounds' paired differences, beside the metrics' packing).
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf
import tensorflow_federated as tff


def _leaves(value: Any) -> list:
  """The tensors of a state value (Python containers or `tff.structure.Struct`) in
  the order of its type: the order TFF itself serializes it in."""
  return tff.structure.flatten(tff.structure.from_container(value, recursive=True))


def _has_server_state_form(process: tff.templates.IterativeProcess) -> bool:
  """`initialize() -> S@SERVER`, `next(S@SERVER, data, client_states) -> (S@SERVER,
  client_states, metrics)` with S a struct: the form `with_flat_server_state` wraps."""
  parameter = process.next.type_signature.parameter
  result = process.next.type_signature.result
  if (process.initialize.type_signature.parameter is not None
      or not isinstance(parameter, tff.types.StructType) or len(parameter) != 3
      or not isinstance(result, tff.types.StructType) or len(result) != 3):
    return False
  state_type = parameter[0]
  return (isinstance(state_type, tff.types.FederatedType)
          and state_type.placement is tff.SERVER
          and isinstance(state_type.member, tff.types.StructType)
          and result[0] == state_type)


def with_flat_server_state(process: tff.templates.IterativeProcess
                           ) -> tuple[tff.templates.IterativeProcess,
                                      Callable[[Any], list], Callable[[list], Any]]:
  """(process whose `initialize` and `next` take and return the flat state,
  flatten, unflatten) for a process `initialize() -> state @SERVER`,
  `next(state, data, client_states) -> (state, client_states, metrics)`.

  A process of another form (a state that is not a server-placed struct) is
  returned unwrapped, with identities for `flatten` and `unflatten`."""
  if not _has_server_state_form(process):
    return process, lambda state: state, lambda state: state
  parameter = process.next.type_signature.parameter
  state_type = parameter[0]
  nested_type = state_type.member
  leaf_types = tff.structure.flatten(nested_type)
  flat_type = tff.types.StructWithPythonType([(None, t) for t in leaf_types], list)

  def unflatten(flat: list) -> Any:
    return tff.types.type_to_py_container(
        tff.structure.pack_sequence_as(nested_type, list(flat)), nested_type)

  @tff.tensorflow.computation(flat_type)
  def nest(flat):
    return unflatten([tf.identity(t) for t in flat])

  @tff.tensorflow.computation(nested_type)
  def flatten_in_runtime(state):
    return [tf.identity(t) for t in _leaves(state)]

  @tff.federated_computation
  def initialize_fn():
    return tff.federated_map(flatten_in_runtime, process.initialize())

  @tff.federated_computation(tff.FederatedType(flat_type, tff.SERVER), parameter[1],
                             parameter[2])
  def next_fn(flat_state, data, client_states):
    new_state, new_client_states, metrics = process.next(
        tff.federated_map(nest, flat_state), data, client_states)
    return (tff.federated_map(flatten_in_runtime, new_state), new_client_states,
            metrics)

  return (tff.templates.IterativeProcess(initialize_fn, next_fn),
          _leaves, unflatten)
