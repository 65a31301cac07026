"""The machine a measurement is made on: what a kept or compared time depends on."""

from __future__ import annotations

import contextlib
import dataclasses
import os

# The vector extensions that decide which of TensorFlow's CPU kernels run.
_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni")


@dataclasses.dataclass(frozen=True)
class Machine:
  cpu: str
  extensions: tuple[str, ...]
  cores: int

  def label(self) -> str:
    """The CPU model and the cores this process may use, as one line."""
    return f"{self.cpu}, {self.cores} cores"


def this_machine(cpuinfo: str = "/proc/cpuinfo") -> Machine:
  """This process's machine: its first processor's model and extensions as `cpuinfo`
  lists them (an unknown CPU where it is not readable) and the cores its affinity
  allows."""
  model, extensions = "unknown CPU", ()
  with contextlib.suppress(OSError), open(cpuinfo) as f:
    for line in f:
      if not line.strip():  # the first processor's block ends at its first blank line
        break
      if line.startswith("model name"):
        model = line.split(":", 1)[1].strip()
      if line.startswith("flags"):
        cpu_flags = set(line.split(":", 1)[1].split())
        extensions = tuple(e for e in _EXTENSIONS if e in cpu_flags)
  return Machine(model, extensions, len(os.sched_getaffinity(0)))
