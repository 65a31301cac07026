"""Runs any unified optimizer: rounds (= communications), costs, objective, outputs.

Each evaluation's row is appended to metrics.csv and released to TensorBoard
(<output_dir>/tensorboard, `tff.program`) as it is made, so a long run can be watched.

After every `eval_every` rounds (and the last) it records F at the reported iterate
(w = the server's y, beta_m = each device's y), its relative suboptimality
(F - F*) / F* against the central optimum, and what the run has cost per device so far:
local iterations, w- and beta-gradient evaluations (component gradients; a full
gradient counts n), bytes down and up (`training.ledger`, from the TFF types; with
partial participation, averaged over all devices). Each round runs on the algorithm's
`participants`, whose new states replace theirs. Rows go
to metrics.csv; summary.json holds the settings, the constants, the step parameters,
`final` and the communications each precision took.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import time
from typing import Callable, Optional

import numpy as np
import tensorflow_federated as tff
import tqdm

from tff_pflego import files
from tff_pflego.training import ledger, program_io
from tff_pflego.unified import objectives
from tff_pflego.unified.objectives import DeviceData
from tff_pflego.unified.process import UnifiedAlgorithm

PRECISIONS = (1e-2, 1e-4, 1e-6)
FIELDS = ("round", "objective", "relative_suboptimality", "local_iterations",
          "w_gradients_per_device", "beta_gradients_per_device", "bytes_down_per_device",
          "bytes_up_per_device", "estimation_error", "test_accuracy", "seconds")


@dataclasses.dataclass(frozen=True)
class Extras:
  """Problem-specific scores: estimation error against the generating parameters
  (synthetic) and the local models' test accuracy (real data)."""
  estimation_error: Optional[Callable[[np.ndarray, np.ndarray], float]] = None
  test_accuracy: Optional[Callable[[np.ndarray, np.ndarray], float]] = None


def rounds_to_reach(rows: list[dict], precision: float) -> Optional[int]:
  for row in rows:
    if row["relative_suboptimality"] <= precision:
      return row["round"]
  return None


class _Outputs:
  """metrics.csv rows and TensorBoard scalars, written as each evaluation is made."""

  def __init__(self, output_dir: str):
    os.makedirs(output_dir, exist_ok=True)
    self.output_dir = output_dir
    self._csv = open(os.path.join(output_dir, "metrics.csv"), "w", newline="")
    self._writer = csv.DictWriter(self._csv, FIELDS)
    self._writer.writeheader()
    self._tensorboard = tff.program.TensorBoardReleaseManager(
        os.path.join(output_dir, "tensorboard"))

  def release(self, row: dict) -> None:
    self._writer.writerow(row)
    self._csv.flush()
    scalars = {k: v for k, v in row.items() if k != "round" and np.isfinite(v)}
    program_io.run(self._tensorboard.release({"eval": scalars}, int(row["round"])))

  def finish(self, summary: dict) -> None:
    self._csv.close()
    files.write_json(os.path.join(self.output_dir, "summary.json"), summary)


def run(algorithm: UnifiedAlgorithm, data: DeviceData, rounds: int, optimum: float,
        output_dir: Optional[str] = None, eval_every: int = 1, extras: Extras = Extras(),
        progress: bool = False, summary_extra: Optional[dict] = None) -> dict:
  objective = algorithm.objective
  traffic = ledger.traffic_per_client(algorithm.broadcast_type, algorithm.update_type)
  state = algorithm.process.initialize()
  device_states = algorithm.initial_device_states
  totals = dict(local_iterations=0, w_gradients=0, beta_gradients=0, participations=0)
  rows: list[dict] = []
  outputs = _Outputs(output_dir) if output_dir else None
  evaluate = objectives.objective_evaluator(objective, data)
  start = time.perf_counter()

  def record(round_num: int) -> None:
    w = algorithm.global_iterate(state)
    betas = algorithm.local_iterates(device_states)
    value = evaluate(w, betas)
    m = objective.num_devices
    rows.append(dict(
        round=round_num, objective=value,
        relative_suboptimality=(value - optimum) / abs(optimum),
        local_iterations=totals["local_iterations"],
        w_gradients_per_device=totals["w_gradients"] / m,
        beta_gradients_per_device=totals["beta_gradients"] / m,
        bytes_down_per_device=traffic["bytes_down"] * totals["participations"] / m,
        bytes_up_per_device=traffic["bytes_up"] * totals["participations"] / m,
        estimation_error=(extras.estimation_error(w, betas)
                          if extras.estimation_error else float("nan")),
        test_accuracy=(extras.test_accuracy(w, betas) if extras.test_accuracy
                       else float("nan")),
        seconds=time.perf_counter() - start))
    if outputs:
      outputs.release(rows[-1])

  record(0)
  for round_num in tqdm.trange(1, rounds + 1, disable=not progress, unit="comm"):
    cohort = algorithm.participants(round_num - 1)
    state, new_states, metrics = algorithm.process.next(
        state, [algorithm.client_inputs[i] for i in cohort],
        [device_states[i] for i in cohort])
    device_states = list(device_states)
    for new in new_states:  # matched by the device each state names
      device_states[int(new["device"])] = new
    totals["participations"] += len(cohort)
    totals["local_iterations"] += int(metrics["schedule"]["local_steps"])
    totals["w_gradients"] += int(metrics["counts"]["w_gradients"])
    totals["beta_gradients"] += int(metrics["counts"]["beta_gradients"])
    if round_num % eval_every == 0 or round_num == rounds:
      record(round_num)
  final = rows[-1]
  summary = dict(
      algorithm=algorithm.name, objective=dataclasses.asdict(objective),
      communications=rounds,
      final=dict(objective=final["objective"], optimum=optimum,
                 relative_suboptimality=final["relative_suboptimality"],
                 estimation_error=final["estimation_error"],
                 test_accuracy=final["test_accuracy"]),
      communications_to_reach={f"{p:g}": rounds_to_reach(rows, p) for p in PRECISIONS},
      seconds=final["seconds"], **(summary_extra or {}))
  if outputs:
    outputs.finish(summary)
  summary["rows"] = rows
  return summary
