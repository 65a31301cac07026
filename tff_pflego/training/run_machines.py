"""The machines a run's rounds were made on: one segment per start or resume.

A run is bit-exact only on one machine: TensorFlow's CPU kernels differ with the vector
extensions it may use (`ONEDNN_MAX_CPU_ISA` narrows them), so a resumed run's rounds
after the resume may differ from what the first machine would have made. Each segment
records the machine from its first round on; summary.json holds them all.
"""

from __future__ import annotations

import json
import os

from tff_pflego import files
from tff_pflego.machine import this_machine
from tff_pflego.training.run_files import MACHINES_FILE

ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"


def this_segment(first_round: int) -> dict:
  """This process's machine, TensorFlow version and kernel limit, from `first_round`."""
  import tensorflow as tf
  machine = this_machine()
  return dict(first_round=first_round, cpu=machine.cpu, extensions=list(machine.extensions),
              cores=machine.cores, tensorflow=tf.__version__,
              onednn_max_cpu_isa=os.environ.get(ISA_VARIABLE))


def read_segments(run_dir: str) -> list[dict]:
  """The run's segments, oldest first; [] where none was recorded."""
  path = os.path.join(run_dir, MACHINES_FILE)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)


def record_start(run_dir: str, first_round: int) -> None:
  """Adds this process's segment from `first_round` on after the segments of earlier
  rounds (a resumed run's; those from `first_round` on are made again here, and a run
  started afresh at round 0 keeps none)."""
  segments = [s for s in read_segments(run_dir) if s["first_round"] < first_round]
  segments.append(this_segment(first_round))
  files.write_json(os.path.join(run_dir, MACHINES_FILE), segments)
