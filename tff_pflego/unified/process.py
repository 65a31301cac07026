"""One communication of any unified optimizer, as a TFF iterative process.

  next(state, device indices, device_states):
    distributor  the server draws the round's schedule from (seed, round) and
                 broadcasts it with the global block's state
    client work  each device runs the round's local iterations and its part of the
                 communicating one: (broadcast, data, state) -> update, state, counts
    aggregator   the unweighted mean of the updates (F is the unweighted mean of f_m;
                 every device takes part, as in the paper, or a uniform cohort)
    finalizer    the server's step of the global block from the mean update
  -> (new state, new device states @CLIENTS, metrics @SERVER)

The metrics are the schedule (local iterations K, whether w stepped, whether the
reference point was refreshed) and the gradient evaluations summed over devices.
Device states are OrderedDict(device=m, beta=the local block's state).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.unified import sampling
from tff_pflego.unified.constants import StepParameters
from tff_pflego.unified.objectives import DeviceData, Objective


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """What every unified optimizer is built from (besides the objective)."""
  params: StepParameters  # step size, probabilities, momentum weights
  seed: int  # every draw of the run (`sampling`)
  frozen: bool = True  # ASCD: the block not sampled keeps y, z (the reference's)
  local_steps: int = 5  # LSGD-PFL: tau iterations between two averagings
  lsgd_lr: Optional[float] = None  # LSGD-PFL's eta; None: ASVRCD's eta = 1/(4 calL)
  w_gradient_scale: float = 1.0  # block CD: the w block's step is eta times this
  # Partial participation: r of the M devices take part in each round (None: all).
  devices_per_round: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class UnifiedAlgorithm:
  name: str
  objective: Objective
  process: tff.templates.IterativeProcess
  initial_device_states: list
  broadcast_type: Any
  update_type: Any
  # What `next` takes at the clients: each device's index (its data is built into
  # the client computation) or, without built-in data, its examples.
  client_inputs: list
  # Partial participation: the round's devices are `sampling.cohort(seed, round, M,
  # devices_per_round)`; the others' states stay as they are. None: every device.
  devices_per_round: Optional[int] = None
  seed: int = 0
  device_files: Optional[DeviceFiles] = None  # the examples the clients read

  def release(self) -> None:
    """Deletes the device files: the process cannot run after this."""
    if self.device_files is not None:
      self.device_files.remove()

  def participants(self, round_num: int) -> list[int]:
    """The devices taking part in round `round_num` (0 is the first)."""
    m = self.objective.num_devices
    if self.devices_per_round is None or self.devices_per_round >= m:
      return list(range(m))
    return sampling.cohort(self.seed, round_num, m, self.devices_per_round)

  @staticmethod
  def global_iterate(state) -> np.ndarray:
    """The w the algorithm reports (its y)."""
    return np.asarray(state["w"]["y"])

  @staticmethod
  def local_iterates(device_states: list) -> np.ndarray:
    return np.stack([np.asarray(s["beta"]["y"]) for s in device_states])


class DeviceFiles:
  """Each device's examples as raw float64 / int32 files in a private temporary
  directory, read by device index inside TensorFlow; `remove` deletes it (a run does
  when it ends, `UnifiedAlgorithm.release`; at the latest it goes when Python exits)."""

  def __init__(self, data: DeviceData):
    self.directory = tempfile.mkdtemp(prefix="tff_pflego_devices_")
    atexit.register(self.remove)
    self.shape = data.x.shape[1:]
    for m in range(data.num_devices):
      np.ascontiguousarray(data.x[m], np.float64).tofile(self._path(m, "x"))
      np.ascontiguousarray(data.y[m], np.int32).tofile(self._path(m, "y"))

  def remove(self) -> None:
    shutil.rmtree(self.directory, ignore_errors=True)

  def _path(self, device: int, part: str) -> str:
    return os.path.join(self.directory, f"{part}_{device}.bin")

  def read(self, device: tf.Tensor) -> collections.OrderedDict:
    def path(part):
      return tf.strings.join([os.path.join(self.directory, part + "_"),
                              tf.strings.as_string(device), ".bin"])
    x = tf.reshape(tf.io.decode_raw(tf.io.read_file(path("x")), tf.float64),
                   self.shape)
    y = tf.reshape(tf.io.decode_raw(tf.io.read_file(path("y")), tf.int32),
                   self.shape[:1])
    return collections.OrderedDict(x=x, y=y)


def _spec(value) -> tff.types.Type:
  return tff.types.to_type(tf.nest.map_structure(
      lambda v: tff.TensorType(np.asarray(v).dtype, np.shape(v)), value))


def data_type(objective: Objective, num_examples: int) -> tff.types.Type:
  return tff.types.to_type(collections.OrderedDict(
      x=tff.TensorType(np.float64, [num_examples, objective.num_features]),
      y=tff.TensorType(np.int32, [num_examples])))


def compose(name: str, objective: Objective, w_initial, beta_initial,
            schedule_fn: Callable, client_fn: Callable, server_fn: Callable,
            data: DeviceData, devices_per_round: Optional[int] = None,
            seed: int = 0) -> UnifiedAlgorithm:
  """The process of the module docstring from the algorithm's TensorFlow functions:
  schedule_fn(round) -> dict, client_fn(broadcast, data, device state) -> (update,
  device state, counts), server_fn(w state, schedule, mean update) -> w state.

  `next` sends each client its device index, and the client reads that device's
  examples from a file (`DeviceFiles`): a round sends indices, not data. Measured
  against the alternatives (ASCD, M = 20): passing the examples as the round's client
  data cost 12 ms of a 61 ms synthetic round (20 x 1000 x 15 float64); building them
  into the client computation as constants cost ~110 ms of a 207 ms MNIST round (20 x
  100 x 784), the worker handling the constants at every call. With
  `devices_per_round`, `next` takes the round's cohort only (`participants`) and the
  mean update is the cohort's (unbiased for the mean over all devices).
  """
  num_examples = data.num_examples
  w_type = _spec(w_initial)
  device_state_example = collections.OrderedDict(device=np.int32(0), beta=beta_initial)
  device_state_type = _spec(device_state_example)
  round_type = tff.TensorType(np.int32)

  @tff.tensorflow.computation
  def initial_state():
    return collections.OrderedDict(
        w=tf.nest.map_structure(tf.constant, w_initial), round=tf.constant(0))

  @tff.tensorflow.computation(round_type)
  def draw_schedule(round_num):
    return collections.OrderedDict(round=round_num, **schedule_fn(round_num))

  schedule_type = draw_schedule.type_signature.result
  broadcast_type = tff.types.to_type(
      collections.OrderedDict(schedule=schedule_type, w=w_type))
  data_t = tff.FunctionType(tff.TensorType(np.int32), data_type(objective, num_examples))

  files = DeviceFiles(data)

  @tff.tensorflow.computation(data_t.parameter)
  def examples_of(device):
    return files.read(device)

  @tff.tensorflow.computation(broadcast_type, data_t.parameter, device_state_type)
  def client_work(broadcast, device, state):
    update, new_state, counts = client_fn(broadcast, examples_of(device), state)
    return collections.OrderedDict(update=update, state=new_state, counts=counts)

  update_type = client_work.type_signature.result.update

  @tff.tensorflow.computation(w_type, schedule_type, update_type)
  def finalize(w_state, schedule, mean_update):
    return server_fn(w_state, schedule, mean_update)

  @tff.tensorflow.computation(round_type)
  def increment(round_num):
    return round_num + 1

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial_state, tff.SERVER)

  state_type = initialize.type_signature.result

  @tff.federated_computation(state_type, tff.FederatedType(np.int32, tff.CLIENTS),
                             tff.FederatedType(device_state_type, tff.CLIENTS))
  def next_fn(state, devices, device_states):
    schedule = tff.federated_map(draw_schedule, state.round)
    broadcast = tff.federated_broadcast(
        tff.federated_zip(collections.OrderedDict(schedule=schedule, w=state.w)))
    outputs = tff.federated_map(client_work, (broadcast, devices, device_states))
    mean_update = tff.federated_mean(outputs.update)
    new_w = tff.federated_map(finalize, (state.w, schedule, mean_update))
    new_state = tff.federated_zip(collections.OrderedDict(
        w=new_w, round=tff.federated_map(increment, state.round)))
    metrics = tff.federated_zip(collections.OrderedDict(
        schedule=schedule, counts=tff.federated_sum(outputs.counts)))
    return new_state, outputs.state, metrics

  initial_states = [collections.OrderedDict(device=np.int32(m), beta=beta_initial)
                    for m in range(objective.num_devices)]
  return UnifiedAlgorithm(name, objective, tff.templates.IterativeProcess(initialize, next_fn),
                          initial_states, broadcast_type, update_type,
                          [np.int32(m) for m in range(objective.num_devices)],
                          devices_per_round, seed, files)
