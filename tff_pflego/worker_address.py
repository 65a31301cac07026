"""A TFF worker's address, 'host:port'. Free of TensorFlow: `--workers` is checked
before TensorFlow loads."""

from __future__ import annotations


def parse_address(address: str) -> tuple[str, int]:
  """'host:port' -> (host, port); raises ValueError on anything else."""
  host, sep, port = address.strip().rpartition(":")
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"not a host:port address: {address!r}")
  return host, int(port)
