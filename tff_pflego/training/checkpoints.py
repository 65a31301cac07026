"""Checkpoints of a run through `tff.program.FileProgramStateManager`.

One checkpoint (version = round number) holds everything the run's future depends on:

    format        "tff_pflego/checkpoint/v1"
    fingerprint   JSON of the settings that must match to resume (dataset, algorithm,
                  seed, hyperparameters, ...)
    round         the last completed round t
    elapsed_s     wall time spent so far
    sampler       JSON of the client sampler's random state after round t
    server        the algorithm's server state after round t
    clients       {visited: bool[I], state: the personal-state structure with every
                  leaf stacked over the I clients}  (heads; any algorithm's state)

so a run resumed from round t continues exactly as it would have. Saving is atomic
(TFF writes a temporary directory and renames it). A checkpoint that cannot be read,
or that was written by another model or other settings, raises `CheckpointError`
(a `UserError`) and is left as it is.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_pflego.errors import UserError
from tff_pflego.training import program_io
from tff_pflego.training.run_files import CHECKPOINT_PREFIX

FORMAT = "tff_pflego/checkpoint/v1"
PREFIX = CHECKPOINT_PREFIX


class CheckpointError(UserError):
  """A checkpoint is unreadable or belongs to another run."""


@dataclasses.dataclass
class RunState:
  """The state of a run after `round_num` completed rounds."""
  round_num: int
  server_state: Any
  client_states: dict[int, collections.OrderedDict]
  sampler_state: dict
  elapsed_s: float = 0.0


def _to_json(value: Any) -> str:
  return json.dumps(value, sort_keys=True, default=lambda o: o.item())


def _as_str(value: Any) -> str:
  value = value.item() if isinstance(value, np.ndarray) else value
  return value.decode() if isinstance(value, bytes) else str(value)


class CheckpointManager:
  """Saves and restores `RunState`s under `root_dir` (see the module docstring)."""

  def __init__(self, root_dir: str, fingerprint: dict, server_template: Any,
               client_template: collections.OrderedDict, num_clients: int,
               keep: int = 3):
    self.root_dir = root_dir
    self._fingerprint = fingerprint
    self._server_template = server_template
    self._client_template = client_template
    self._num_clients = num_clients
    self._manager = tff.program.FileProgramStateManager(
        root_dir, prefix=PREFIX, keep_total=keep, keep_first=False)

  def rounds(self) -> list[int]:
    """Rounds with a checkpoint on disk, oldest first."""
    if not os.path.isdir(self.root_dir):
      return []
    return program_io.run(self._manager.get_versions()) or []

  def latest_round(self) -> Optional[int]:
    rounds = self.rounds()
    return rounds[-1] if rounds else None

  def save(self, run: RunState) -> None:
    """Writes the checkpoint of `run` (replacing one of the same round)."""
    path = os.path.join(self.root_dir, f"{PREFIX}{run.round_num}")
    if os.path.exists(path):  # re-saved after a resume: same round, same contents
      tf.io.gfile.rmtree(path)
    program_io.run(self._manager.save(self._program_state(run), run.round_num))

  def load_latest(self) -> RunState:
    """The newest checkpoint (`FileProgramStateManager.load_latest`), checked to belong
    to this run."""
    template = self._program_state(RunState(0, self._server_template, {}, {}))
    try:
      raw, round_num = program_io.run(self._manager.load_latest(template))
    except Exception as e:  # pylint: disable=broad-except
      path = os.path.join(self.root_dir, f"{PREFIX}{self.latest_round()}")
      raise CheckpointError(
          f"checkpoint {path} cannot be read ({type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}); it is corrupted or was written "
          "by another model: move it away to resume from an older one, or start afresh "
          "with --noresume --overwrite") from e
    if raw is None:
      raise CheckpointError(f"no checkpoint in {self.root_dir}")
    path = os.path.join(self.root_dir, f"{PREFIX}{round_num}")
    self._check_compatible(raw, template, path)
    clients = raw["clients"]
    client_states = {}
    for i in np.flatnonzero(clients["visited"]):
      client_states[int(i)] = tf.nest.map_structure(
          lambda leaf, i=i: np.asarray(leaf[i]), clients["state"])
    return RunState(round_num=int(raw["round"]), server_state=raw["server"],
                    client_states=client_states,
                    sampler_state=json.loads(_as_str(raw["sampler"])),
                    elapsed_s=float(raw["elapsed_s"]))

  def _check_compatible(self, raw, template, path: str) -> None:
    if _as_str(raw["format"]) != FORMAT:
      raise CheckpointError(f"checkpoint {path} has format {_as_str(raw['format'])!r}, "
                            f"expected {FORMAT!r}")
    saved = json.loads(_as_str(raw["fingerprint"]))
    differences = [f"{k}: checkpoint {saved.get(k)!r}, this run {v!r}"
                   for k, v in sorted(json.loads(_to_json(self._fingerprint)).items())
                   if saved.get(k) != v]
    if differences:
      raise CheckpointError(f"checkpoint {path} belongs to another run ("
                            f"{'; '.join(differences)}); use another --output_dir or "
                            "start afresh with --noresume --overwrite")
    for got, want in zip(tf.nest.flatten(raw), tf.nest.flatten(template)):
      if np.shape(got) != np.shape(want):
        raise CheckpointError(f"checkpoint {path} holds a tensor of shape "
                              f"{np.shape(got)} where this model has {np.shape(want)}")

  def _program_state(self, run: RunState) -> collections.OrderedDict:
    visited = np.zeros(self._num_clients, bool)
    per_client = []
    for i in range(self._num_clients):
      state = run.client_states.get(i)
      visited[i] = state is not None
      per_client.append(state if state is not None else self._client_template)
    stacked = tf.nest.map_structure(lambda *leaves: np.stack([np.asarray(l) for l in leaves]),
                                    *per_client)
    return collections.OrderedDict(
        format=FORMAT, fingerprint=_to_json(self._fingerprint),
        round=np.int64(run.round_num), elapsed_s=np.float64(run.elapsed_s),
        sampler=_to_json(run.sampler_state), server=run.server_state,
        clients=collections.OrderedDict(visited=visited, state=stacked))
