"""The machine a benchmark records: read from a cpuinfo file as written here."""

import os

from tff_pflego.machine import Machine, this_machine

_CPUINFO = """processor\t: 0
model name\t: Example CPU 9000
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw
bogomips\t: 4000.00

processor\t: 1
model name\t: Other CPU
flags\t\t: fpu sse2
"""


def test_reads_the_first_processors_model_and_extensions(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text(_CPUINFO)
  cores = len(os.sched_getaffinity(0))
  assert this_machine(str(path)) == Machine("Example CPU 9000", ("avx2", "fma", "avx512f"),
                                            cores)
  assert this_machine(str(path)).label() == f"Example CPU 9000, {cores} cores"


def test_a_first_processor_without_tracked_extensions_has_none(tmp_path):
  path = tmp_path / "cpuinfo"
  first_without = _CPUINFO.replace("avx avx2 fma avx512f avx512bw", "avx")
  path.write_text(first_without.replace("flags\t\t: fpu sse2\n", "flags\t\t: fpu avx2\n"))
  assert this_machine(str(path)).extensions == ()
  assert this_machine(str(path)).cpu == "Example CPU 9000"


def test_an_unreadable_cpuinfo_is_an_unknown_cpu(tmp_path):
  machine = this_machine(str(tmp_path / "missing"))
  assert (machine.cpu, machine.extensions) == ("unknown CPU", ())
