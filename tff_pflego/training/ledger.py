"""The cost ledger: bytes each client sends and receives, from TFF type signatures.

A round costs, per participating client:
  bytes_down  the broadcast (the shared weights' type),
  bytes_up    the update sent for aggregation plus its weight N_i (float32);
body passes are counted at run time (`algorithms.instrumentation.BodyPassCounter`) and client compute time
is measured inside the client computation (`instrumentation.timed`); the server part of a
round is its wall time minus the slowest client's compute time.
"""

from __future__ import annotations

import numpy as np
import tensorflow_federated as tff


def type_bytes(value_type: tff.types.Type) -> int:
  """Bytes of a value of `value_type` (fully defined tensor shapes only)."""
  if isinstance(value_type, tff.TensorType):
    shape = tuple(value_type.shape or ())
    if any(d is None for d in shape):
      raise ValueError(f"shape of {value_type} is not fully defined")
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(value_type.dtype).itemsize
  if isinstance(value_type, tff.StructType):
    return sum(type_bytes(member) for member in value_type)
  if isinstance(value_type, tff.FederatedType):
    return type_bytes(value_type.member)
  raise TypeError(f"cannot size {value_type}")


def traffic_per_client(broadcast_type: tff.types.Type, update_type: tff.types.Type
                       ) -> dict[str, int]:
  return dict(bytes_down=type_bytes(broadcast_type),
              bytes_up=type_bytes(update_type) + np.dtype(np.float32).itemsize)
