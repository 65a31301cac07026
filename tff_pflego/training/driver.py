"""The training loop: one driver for every personalized algorithm.

The driver owns what is not the algorithm's: client sampling, the clients' personal
state between rounds, evaluation, logging and outputs. It runs the algorithm's
`next(state, client_data, client_states)` with client data resolved on the clients
from their ids (`tff.simulation.compose_dataset_computation_with_iterative_process`),
so a round sends ids, not datasets. The caller provides the TFF execution context
(`tff_pflego.runtime.execution_context`: a private local worker or remote workers).

Every round's metrics go out through `tff.program` release managers (`release.py`);
checkpoints (`checkpoints.py`) make a run resumable with identical results.

Two evaluation protocols are reported:
* all clients (the paper's text): every `eval_every` rounds and each of the last 10,
  every client with the current body and its current head -> metrics.csv, clients.csv;
* sampled clients (the reference code): every round, the round's clients right after
  their local update, accuracy pooled over their test examples -> rounds.csv,
  `test_accuracy_sampled_pooled`. The local model is PFLEGO's new head on the body it
  trained with (evaluated here from the states, on the test part only), and for the
  averaging baselines the client's locally trained model (evaluated by the client
  inside the round, `evaluates_in_round`).
`summary.json["final"]` holds each metric's mean over the last 10 evaluations (rounds,
for the sampled protocol), as the paper's tables do.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow_federated as tff
import tqdm

from tff_pflego import files, records, runtime
from tff_pflego.algorithms import composition, packed_metrics
from tff_pflego.algorithms.api import PersonalizedAlgorithm
from tff_pflego.data.federated import FederatedData
from tff_pflego.errors import UserError
from tff_pflego.training import curves, evaluation, ledger, outputs, run_machines
from tff_pflego.training.checkpoints import CheckpointManager, RunState
from tff_pflego.training.client_store import ClientStateStore
from tff_pflego.training.release import RunReleaser, read_rows
from tff_pflego.training.run_files import (CHECKPOINT_DIR, CLIENTS_FILE, CONFIG_FILE,
                                           PARTITION_FILE, SUMMARY_FILE)
from tff_pflego.training.sampling import ClientSampler

FINAL_WINDOW = 10
CLIENT_FIELDS = ["client", "classes", "num_train", "num_test", "train_loss",
                 "train_accuracy", "test_loss", "test_accuracy"]


@dataclasses.dataclass
class RunConfig:
  rounds: int
  output_dir: str
  eval_every: int = 1
  sampled_eval: bool = True
  eval_clients: Optional[int] = None  # None: all clients; N: a fixed seeded sample
  seed: int = 0  # draws the evaluation sample
  progress: bool = True
  metadata: dict = dataclasses.field(default_factory=dict)  # goes into summary.json
  reference_accuracy: Optional[float] = None  # the paper's figure, drawn on the plot
  checkpoint_every: int = 10  # and always after the last round; 0: only then
  resume: bool = True  # continue from the newest checkpoint in output_dir, if any
  fingerprint: dict = dataclasses.field(default_factory=dict)  # must match to resume
  settings: dict = dataclasses.field(default_factory=dict)  # saved as config.json
  # Also score every client after it refits its head on the current body.
  head_refit: Optional[evaluation.HeadRefit] = None


def train(algorithm: PersonalizedAlgorithm, data: FederatedData, sampler: ClientSampler,
          config: RunConfig) -> dict[str, Any]:
  """Runs (or resumes) `config.rounds` rounds and writes the outputs; returns the summary.

  After each round its metrics are released; every `checkpoint_every` rounds, after
  the last one, and when the loop is left by an exception or a stop signal, the state
  after the last completed round is checkpointed, so no finished round is lost. A round
  counts as completed when its training is done, before its evaluation: a run stopped
  during an evaluation keeps the round, and on resuming evaluates it first.
  """
  process = _process_on_client_ids(algorithm, data)
  next_round = packed_metrics.unpacking_next(process)
  store = ClientStateStore(lambda i: algorithm.initial_client_state(i, data.num_classes[i]))
  evaluate_clients = _client_evaluation(algorithm, data, store, config.head_refit)
  # The sampled protocol scores the test part only (its pooled test accuracy).
  evaluate_sampled = (_client_evaluation(algorithm, data, store, parts=("test",))
                      if config.sampled_eval and not algorithm.evaluates_in_round
                      else None)
  evaluated = evaluation.evaluation_sample(data.num_clients, config.eval_clients,
                                           config.seed)
  traffic = ledger.traffic_per_client(algorithm.broadcast_type, algorithm.update_type)
  initial_state = process.initialize()
  checkpoints = checkpoint_manager(algorithm, data, config.output_dir, config.fingerprint,
                                   initial_state)
  committed, resumed, first_round = _starting_point(checkpoints, initial_state, store,
                                                    sampler, config)
  state = committed.server_state
  first_trained = committed.round_num + 1 if resumed else 0
  # Only now, with the checkpoint accepted, does the run touch its directory.
  files.write_json(os.path.join(config.output_dir, CONFIG_FILE), config.settings)
  # The run's own copy of its partition: `--partition_file` replays it.
  files.copy_file(data.manifest_path, os.path.join(config.output_dir, PARTITION_FILE))
  releaser = RunReleaser(config.output_dir, committed.round_num if resumed else None)
  saved_round = committed.round_num if resumed else None
  start = time.monotonic() - committed.elapsed_s
  run_machines.record_start(config.output_dir, first_trained)

  def commit(round_num: int, server_state: Any) -> RunState:
    return RunState(round_num, server_state, store.snapshot(), sampler.state,
                    time.monotonic() - start)

  table = None
  bar = tqdm.tqdm(range(first_round, config.rounds + 1),
                  disable=not config.progress or first_round > config.rounds,
                  desc=config.metadata.get("algorithm", "train"), unit="round",
                  dynamic_ncols=True, initial=first_round, total=config.rounds + 1)
  try:
    for round_num in bar:
      runtime.raise_if_stopped()
      if round_num > committed.round_num:
        state, row = _run_round(round_num, state, next_round, algorithm, data, sampler,
                                store, evaluate_sampled)
        releaser.release_round(round_num, row | traffic)
        committed = commit(round_num, state)
      if _evaluates(round_num, config):
        table = evaluate_clients(state, evaluated)
        runtime.raise_if_stopped()
        summary = evaluation.summarize(table, population=data.num_clients)
        releaser.release_evaluation(round_num, dict(
            wall_time_s=time.monotonic() - start, **summary))
        bar.set_postfix(acc=f"{summary['test_accuracy_mean']:.4f}",
                        loss=f"{summary['train_loss']:.4f}")
        committed = commit(round_num, state)  # its time, and the states it initialized
      if _checkpoints(round_num, config) and round_num != saved_round:
        checkpoints.save(committed)
        saved_round = round_num
  except BaseException:
    _save_unsaved(checkpoints, committed, saved_round)
    raise
  finally:
    bar.close()
    if table is not None:
      _write_clients_csv(os.path.join(config.output_dir, CLIENTS_FILE), table, data)

  history, rounds = read_rows(releaser.metrics_path), read_rows(releaser.rounds_path)
  summary = _summary(config, history, rounds, time.monotonic() - start, data, len(store))
  files.write_json(os.path.join(config.output_dir, SUMMARY_FILE), summary)
  curves.plot_run(config.output_dir)
  return summary


def _process_on_client_ids(algorithm: PersonalizedAlgorithm, data: FederatedData):
  """The algorithm's process with `next(state, client ids, client states)`."""
  if algorithm.takes_client_ids:
    return algorithm.process
  if algorithm.evaluates_in_round:
    return composition.compose_with_client_ids(data.client_data_computations.train_and_test,
                                               algorithm.process)
  return tff.simulation.compose_dataset_computation_with_iterative_process(
      data.train.dataset_computation, algorithm.process)


def _client_evaluation(algorithm: PersonalizedAlgorithm, data: FederatedData,
                       store: ClientStateStore,
                       refit: Optional[evaluation.HeadRefit] = None,
                       parts: Sequence[str] = evaluation.PARTS):
  """(server state, client indices) -> the clients' per-client evaluation table, with
  the clients' states in `store`."""
  evaluate = build_client_evaluation(algorithm, data, refit, parts)

  def evaluate_clients(server_state, indices) -> dict[str, np.ndarray]:
    states = algorithm.evaluation_states(server_state, store.get(indices))
    return evaluate(algorithm.body_weights(server_state), np.asarray(indices), states)

  return evaluate_clients


def _starting_point(checkpoints: CheckpointManager, initial_state: Any,
                    store: ClientStateStore, sampler: ClientSampler, config: RunConfig
                    ) -> tuple[RunState, bool, int]:
  """The resume policy: the newest checkpoint when resuming and there is one (its
  clients' states and sampler restored), else round 0. Says which in one line.

  Returns (the state started from, whether resumed, the first round to run): the round
  after the checkpoint's, or the checkpoint's own when a stop cut its evaluation short
  (a round is checkpointed before its evaluation); round 0 (its evaluation) when fresh.
  """
  if not (config.resume and checkpoints.latest_round() is not None):
    return RunState(0, initial_state, {}, sampler.state), False, 0
  committed = checkpoints.load_latest()
  last = committed.round_num
  if last > config.rounds:
    raise UserError(f"the checkpoint in {checkpoints.root_dir} is at round "
                    f"{last}, past --rounds={config.rounds}")
  store.restore(committed.client_states)
  sampler.set_state(committed.sampler_state)
  unevaluated = _evaluation_missing(last, config)
  if unevaluated:
    print(f"resuming at round {last} of {config.rounds}: evaluating it first (a stop "
          "cut its evaluation short)", flush=True)
  elif last == config.rounds:
    print(f"run already complete ({config.rounds} rounds) in {config.output_dir}: "
          "nothing to do; --overwrite to start again", flush=True)
  else:
    print(f"resuming from round {last} of {config.rounds}", flush=True)
  return committed, True, last if unevaluated else last + 1


def _run_round(round_num: int, state: Any, next_round: Callable,
               algorithm: PersonalizedAlgorithm,
               data: FederatedData, sampler: ClientSampler, store: ClientStateStore,
               evaluate_sampled: Optional[Callable]) -> tuple[Any, dict]:
  """One training round on the sampled clients -> (new server state, rounds.csv row);
  `evaluate_sampled`: the sampled protocol's evaluation, or None."""
  reporting = sampler.sample()
  trained_with = state
  t0 = time.monotonic()
  if len(reporting):
    ids = [data.client_ids[i] for i in reporting]
    state, client_states, metrics = next_round(state, ids, store.get(reporting))
    refused = store.update(client_states, reporting)
  else:
    metrics, refused = None, 0
    logging.warning("round %d: no client reported; the body is unchanged", round_num)
  row = _round_row(round_num, time.monotonic() - t0, metrics,
                   len(sampler.last_selected), refused)
  if row["rejected_updates"] or refused:
    logging.warning("round %d: rejected %d non-finite client updates", round_num,
                    row["rejected_updates"])
  if algorithm.evaluates_in_round and len(reporting):
    row["test_accuracy_sampled_pooled"] = evaluation.pooled_test_accuracy(
        evaluation.per_client_table(metrics["clients"]))
  elif evaluate_sampled is not None and len(reporting):
    row["test_accuracy_sampled_pooled"] = evaluation.pooled_test_accuracy(
        evaluate_sampled(trained_with, reporting))
  return state, row


def _evaluates(round_num: int, config: RunConfig) -> bool:
  """Every `eval_every` rounds, and each of the last FINAL_WINDOW (`final`'s window)."""
  return round_num % config.eval_every == 0 or round_num > config.rounds - FINAL_WINDOW


def _evaluation_missing(round_num: int, config: RunConfig) -> bool:
  """Whether `round_num` is evaluated and metrics.csv has no row of it."""
  evaluated = {int(row[records.ROUND]) for row in records.read_metrics(config.output_dir)}
  return _evaluates(round_num, config) and round_num not in evaluated


def _checkpoints(round_num: int, config: RunConfig) -> bool:
  """Every `checkpoint_every` rounds (0: never on the way) and after the last round."""
  return round_num == config.rounds or (config.checkpoint_every and round_num > 0
                                        and round_num % config.checkpoint_every == 0)


def _save_unsaved(checkpoints: CheckpointManager, committed: RunState,
                  saved_round: Optional[int]) -> None:
  """On the way out of a failed or stopped run: keep every completed round."""
  if committed.round_num == saved_round or committed.round_num == 0:
    return
  try:
    checkpoints.save(committed)
    logging.warning("checkpoint of round %d saved in %s", committed.round_num,
                    checkpoints.root_dir)
  except Exception:  # pylint: disable=broad-except
    logging.exception("could not save the checkpoint of round %d", committed.round_num)


def build_client_evaluation(algorithm: PersonalizedAlgorithm, data: FederatedData,
                            refit: Optional[evaluation.HeadRefit] = None,
                            parts: Sequence[str] = evaluation.PARTS):
  """(body weights, client indices, their states) -> per-client table.

  Clients sharing the body are scored in cohorts, one client computation per cohort
  (`evaluation.build_cohort_evaluation`), on `parts` only, the cohorts planned by the
  first part's sizes; personal bodies one client at a time, on both parts. With
  `refit`, also after each client refits its head (`evaluation.HeadRefit`).
  """
  evaluation.check_parts(parts, refit)
  if algorithm.personal_body:
    per_client = evaluation.build_personalized_evaluation(
        algorithm.body_fn, algorithm.types, data.train.dataset_computation,
        data.test.dataset_computation, personal_body=True, refit=refit)
    return lambda weights, indices, states: evaluation.per_client_table(
        per_client(weights, [data.client_ids[i] for i in indices], states))

  cohorts = evaluation.build_cohort_evaluation(algorithm.body_fn, algorithm.types,
                                               data.read_client_files, refit=refit,
                                               parts=parts)
  num_examples = {part: data.num_examples(part) for part in parts}

  def evaluate(weights, indices, states):
    plan = evaluation.plan_cohorts(num_examples[parts[0]][indices])
    results = cohorts(weights,
                      [evaluation.cohort_input(data.client_files, num_examples, indices[c],
                                               parts) for c in plan],
                      [evaluation.stack_states([states[j] for j in c]) for c in plan])
    return evaluation.per_client_table(evaluation.unstack_cohort_results(results))

  return evaluate


def checkpoint_manager(algorithm: PersonalizedAlgorithm, data: FederatedData,
                       output_dir: str, fingerprint: dict,
                       initial_state: Any = None) -> CheckpointManager:
  """The checkpoints of the run in `output_dir` (runs `initialize` if not given)."""
  if initial_state is None:
    initial_state = algorithm.process.initialize()
  return CheckpointManager(
      os.path.join(output_dir, CHECKPOINT_DIR), fingerprint, server_template=initial_state,
      client_template=algorithm.initial_client_state(0, data.num_classes[0]),
      num_clients=data.num_clients)


def _round_row(round_num: int, round_time: float, metrics, num_selected: int,
               refused_states: int) -> dict:
  """rounds.csv: the round's training metrics, reports, rejections and body passes.

  `server_time_s` is the round's wall time less its slowest client's: the server's
  update and the driver's transfers, but also any client work that did not overlap the
  slowest client (clients share the cores), so not the server's compute alone."""
  nan = float("nan")
  row = dict(round=round_num, round_time_s=round_time, client_time_s=nan,
             client_compute_s=nan, client_time_max_s=nan, server_time_s=nan,
             num_selected=num_selected,
             num_reports=0, num_examples=0.0, sampled_train_loss=nan,
             rejected_updates=0, rejected_states=refused_states,
             body_forward_passes=nan, body_backward_passes=nan,
             test_accuracy_sampled_pooled=nan)
  if metrics is None:
    return row
  train, clients = metrics["train"], metrics["clients"]
  client_times = [float(c["client_time_s"]) for c in clients]
  row.update(client_time_s=float(np.mean(client_times)),
             client_compute_s=float(np.mean([c["client_compute_s"] for c in clients])),
             client_time_max_s=max(client_times),
             server_time_s=round_time - max(client_times))
  row.update(num_reports=int(train["num_clients"]),
             num_examples=float(train["num_examples"]),
             sampled_train_loss=float(train["loss"]),
             rejected_updates=int(train["rejected_updates"]),
             body_forward_passes=float(np.mean([c["body_forward_passes"]
                                                for c in clients])),
             body_backward_passes=float(np.mean([c["body_backward_passes"]
                                                 for c in clients])))
  return row


def _final_mean(values) -> float:
  tail = [v for v in list(values)[-FINAL_WINDOW:] if v == v]  # drop NaN
  return float(np.mean(tail)) if tail else float("nan")


def _mean(values: list[float]) -> float:
  return float(np.mean(values)) if values else float("nan")


def _column(rows: list[dict], name: str) -> list[float]:
  return [r.get(name, float("nan")) for r in rows]


def _summary(config: RunConfig, history: list[dict], rounds: list[dict],
             wall_time: float, data: FederatedData, clients_seen: int) -> dict:
  evals = [r for r in history if r["round"] > 0] or history  # skip round 0
  window = min(FINAL_WINDOW, len(evals))
  final = {name: _final_mean(_column(evals, name)) for name in
           ("test_accuracy_mean", "test_accuracy_pooled", "test_accuracy_std",
            "test_accuracy_worst10", "train_loss")}
  if config.head_refit is not None:
    final |= {name: _final_mean(_column(evals, name)) for name in
              ("test_accuracy_refit_mean", "test_accuracy_refit_pooled",
               "train_loss_refit")}
  if config.eval_clients is not None:  # the sample mean's standard error
    final["test_accuracy_mean_se"] = _final_mean(_column(evals, "test_accuracy_mean_se"))
  sampled = [v for v in _column(rounds, "test_accuracy_sampled_pooled") if v == v]
  final["test_accuracy_sampled_pooled"] = _final_mean(sampled)
  windows = dict(evaluations=window, sampled_rounds=min(FINAL_WINDOW, len(sampled)))
  round_times = [v for v in _column(rounds, "round_time_s") if v == v]
  mean_of = lambda name: _mean([v for v in _column(rounds, name) if v == v])
  return dict(
      **config.metadata, dataset_display_name=data.spec.display_name,
      rounds=config.rounds, wall_time_s=wall_time,
      time_per_round_s=float(np.mean(round_times)) if round_times else float("nan"),
      clients_seen=clients_seen, num_clients=data.num_clients,
      client_time_per_round_s=mean_of("client_time_s"),
      client_compute_per_round_s=mean_of("client_compute_s"),
      server_time_per_round_s=mean_of("server_time_s"),
      body_passes_per_client_round=dict(forward=mean_of("body_forward_passes"),
                                        backward=mean_of("body_backward_passes")),
      bytes_per_client_round=dict(down=mean_of("bytes_down"), up=mean_of("bytes_up")),
      reports=int(sum(_column(rounds, "num_reports"))),
      rejected_updates=int(sum(_column(rounds, "rejected_updates"))),
      machines=run_machines.read_segments(config.output_dir),
      final=final,
      final_protocols={
          "test_accuracy_mean": "all clients, current body and own head, mean over clients",
          "test_accuracy_pooled": "all clients, pooled over test examples",
          "test_accuracy_sampled_pooled":
              "reference code: the round's clients right after their update, pooled",
          "test_accuracy_refit_mean":
              "all clients, each after refitting its head on the current body "
              "(tau - 1 head-only steps, as a deployed client would), mean over clients",
          "window": _window_text(windows)},
      final_window=windows, paper_test_accuracy=config.reference_accuracy,
      evaluated_clients=(data.num_clients if config.eval_clients is None
                         else config.eval_clients),
      partition_manifest=data.manifest_path, data_provenance=data.provenance)


def _window_text(windows: dict[str, int]) -> str:
  plural = lambda n, noun: f"{n} {noun}{'s' * (n != 1)}"
  text = f"mean of the last {plural(windows['evaluations'], 'evaluation')}"
  if windows["sampled_rounds"]:
    text += f"; sampled clients: the last {plural(windows['sampled_rounds'], 'round')}"
  return text


def _write_clients_csv(path: str, table: dict[str, np.ndarray], data: FederatedData):
  writer = outputs.CsvWriter(path, CLIENT_FIELDS)
  for j, client in enumerate(table["client_index"]):
    writer.write(dict(
        client=data.client_ids[client], classes=data.partition.class_sets[client],
        **{k: table[k][j] for k in CLIENT_FIELDS[2:]}))
  writer.close()
