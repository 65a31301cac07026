"""What a TFF computation is made of: its federated intrinsics and TensorFlow ops."""

from __future__ import annotations

import collections
from typing import Callable

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.computation import computation_impl

_LEAVES = ("tensorflow", "tensorflow_function", "xla", "data", "literal", "intrinsic")


def _walk(computation: tff.Computation, visit: Callable[[str, object], None]) -> None:
  """Calls visit(kind, building block) on every building block of `computation` whose
  kind is one of `_LEAVES` (TensorFlow graphs are not entered)."""

  def walk(message) -> None:
    if message.DESCRIPTOR.full_name == "tensorflow_federated.v0.Computation":
      kind = message.WhichOneof("computation")
      if kind in _LEAVES:
        visit(kind, getattr(message, kind))
        return
    for field, value in message.ListFields():
      if field.message_type is not None:
        for v in (value if field.label == field.LABEL_REPEATED else [value]):
          walk(v)

  walk(computation_impl.ConcreteComputation.get_proto(computation))


def count_intrinsics(computation: tff.Computation) -> collections.Counter:
  """Federated intrinsics referenced in `computation`, by URI."""
  counts = collections.Counter()

  def visit(kind: str, block) -> None:
    if kind == "intrinsic":
      counts[block.uri] += 1

  _walk(computation, visit)
  return counts


def tensorflow_ops(computation: tff.Computation) -> collections.Counter:
  """TensorFlow op types in every TF graph `computation` references, with their
  function libraries."""
  ops = collections.Counter()

  def visit(kind: str, block) -> None:
    if kind == "tensorflow":
      graph = tf.compat.v1.GraphDef()
      block.graph_def.Unpack(graph)
      ops.update(node.op for node in graph.node)
      for function in graph.library.function:
        ops.update(node.op for node in function.node_def)

  _walk(computation, visit)
  return ops
