"""The training loop: one driver for every personalized algorithm.

The driver owns what is not the algorithm's: client sampling, the clients' personal
state between rounds, evaluation, logging and outputs. It runs the algorithm's
`next(state, client_data, client_states)` with client data resolved on the clients
from their ids (`tff.simulation.compose_dataset_computation_with_iterative_process`),
so a round sends ids, not datasets. The caller provides the TFF execution context
(`tff_pflego.runtime.local_execution_context`).

Two evaluation protocols are reported:
* all clients (the paper's text): every `eval_every` rounds and each of the last 10,
  every client with the current body and its current head -> metrics.csv, clients.csv;
* sampled clients (the reference code): every round, the round's clients right after
  their local update (new head, the body they trained with), accuracy pooled over
  their test examples -> rounds.csv, `test_accuracy_sampled_pooled`.
`summary.json["final"]` holds each metric's mean over the last 10 evaluations (rounds,
for the sampled protocol), as the paper's tables do.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Optional

import numpy as np
import tensorflow_federated as tff
import tqdm

from tff_pflego.algorithms.registry import PersonalizedAlgorithm
from tff_pflego.data.federated import FederatedData
from tff_pflego.training import evaluation, outputs
from tff_pflego.training.client_store import ClientStateStore
from tff_pflego.training.sampling import ClientSampler

FINAL_WINDOW = 10
METRICS_FIELDS = ["round", "wall_time_s", "train_loss", "train_accuracy_mean",
                  "test_loss_mean", "test_accuracy_mean", "test_accuracy_pooled",
                  "test_accuracy_std", "test_accuracy_worst10",
                  "test_accuracy_sampled_pooled"]
ROUND_FIELDS = ["round", "round_time_s", "num_clients", "num_examples",
                "sampled_train_loss", "test_accuracy_sampled_pooled",
                "body_forward_passes", "body_backward_passes"]
CLIENT_FIELDS = ["client", "classes", "num_train", "num_test", "train_loss",
                 "train_accuracy", "test_loss", "test_accuracy"]


@dataclasses.dataclass
class RunConfig:
  rounds: int
  output_dir: str
  eval_every: int = 1
  sampled_eval: bool = True
  progress: bool = True
  metadata: dict = dataclasses.field(default_factory=dict)  # goes into summary.json
  reference_accuracy: Optional[float] = None  # the paper's figure, drawn on the plot


class _Outputs:
  """The files of one run, opened together and closed together."""

  def __init__(self, output_dir: str):
    os.makedirs(output_dir, exist_ok=True)
    self.dir = output_dir
    self.metrics = outputs.CsvWriter(os.path.join(output_dir, "metrics.csv"),
                                     METRICS_FIELDS)
    self.rounds = outputs.CsvWriter(os.path.join(output_dir, "rounds.csv"), ROUND_FIELDS)
    self.tensorboard = outputs.TensorBoardWriter(os.path.join(output_dir, "tensorboard"))

  def close(self) -> None:
    for writer in (self.metrics, self.rounds, self.tensorboard):
      writer.close()


def train(algorithm: PersonalizedAlgorithm, data: FederatedData, sampler: ClientSampler,
          config: RunConfig) -> dict[str, Any]:
  """Runs `config.rounds` rounds and writes the run's outputs; returns the summary."""
  process = tff.simulation.compose_dataset_computation_with_iterative_process(
      data.train.dataset_computation, algorithm.process)
  evaluate = evaluation.build_personalized_evaluation(
      algorithm.body_fn, algorithm.types, data.train.dataset_computation,
      data.test.dataset_computation)
  num_classes = data.num_classes
  store = ClientStateStore(lambda i: algorithm.initial_client_state(i, num_classes[i]))
  all_clients = np.arange(data.num_clients)

  def evaluate_clients(weights, indices) -> dict[str, np.ndarray]:
    ids = [data.client_ids[i] for i in indices]
    return evaluation.per_client_table(evaluate(weights, ids, store.get(indices)))

  files = _Outputs(config.output_dir)
  history: dict[str, list] = {name: [] for name in METRICS_FIELDS}
  sampled_history: list[tuple[int, float]] = []
  round_times: list[float] = []
  start = time.monotonic()
  table = None
  try:
    state = process.initialize()
    bar = tqdm.tqdm(range(config.rounds + 1), disable=not config.progress,
                    desc=config.metadata.get("algorithm", "train"), unit="round",
                    dynamic_ncols=True)
    for round_num in bar:
      if round_num > 0:
        sampled = sampler.sample()
        ids = [data.client_ids[i] for i in sampled]
        trained_with = algorithm.body_weights(state)
        t0 = time.monotonic()
        state, client_states, metrics = process.next(state, ids, store.get(sampled))
        round_times.append(time.monotonic() - t0)
        store.update(client_states, sampled)
        row = _round_row(round_num, round_times[-1], metrics)
        if config.sampled_eval and len(sampled):
          row["test_accuracy_sampled_pooled"] = evaluation.pooled_test_accuracy(
              evaluate_clients(trained_with, sampled))
          sampled_history.append((round_num, row["test_accuracy_sampled_pooled"]))
        files.rounds.write(row)
        files.tensorboard.write(round_num, row, prefix="round/")
      if (round_num % config.eval_every == 0
          or round_num > config.rounds - FINAL_WINDOW):  # `final` = last 10 rounds
        table = evaluate_clients(algorithm.body_weights(state), all_clients)
        summary = evaluation.summarize(table)
        row = dict(round=round_num, wall_time_s=time.monotonic() - start, **summary,
                   test_accuracy_sampled_pooled=(
                       sampled_history[-1][1] if sampled_history else float("nan")))
        for name in METRICS_FIELDS:
          history[name].append(row[name])
        files.metrics.write(row)
        files.tensorboard.write(round_num, summary, prefix="eval/")
        bar.set_postfix(acc=f"{summary['test_accuracy_mean']:.4f}",
                        loss=f"{summary['train_loss']:.4f}")
  finally:
    files.close()
    if table is not None:
      _write_clients_csv(os.path.join(config.output_dir, "clients.csv"), table, data)

  summary = _summary(config, history, sampled_history, round_times,
                     time.monotonic() - start, data, len(store))
  outputs.write_json(os.path.join(config.output_dir, "summary.json"), summary)
  _plot(config, history, sampled_history, data)
  return summary


def _round_row(round_num: int, round_time: float, metrics) -> dict:
  clients = metrics["clients"]
  counts = lambda key: np.array([c[key] for c in clients]) if clients else np.zeros(0)
  forward, backward = counts("body_forward_passes"), counts("body_backward_passes")
  return dict(round=round_num, round_time_s=round_time,
              num_clients=int(metrics["train"]["num_clients"]),
              num_examples=float(metrics["train"]["num_examples"]),
              sampled_train_loss=float(metrics["train"]["loss"]),
              body_forward_passes=float(forward.mean()) if len(forward) else 0.0,
              body_backward_passes=float(backward.mean()) if len(backward) else 0.0,
              test_accuracy_sampled_pooled=float("nan"))


def _final_mean(values: list) -> float:
  tail = [v for v in values[-FINAL_WINDOW:] if v == v]  # drop NaN
  return float(np.mean(tail)) if tail else float("nan")


def _summary(config: RunConfig, history, sampled_history, round_times, wall_time,
             data: FederatedData, clients_seen: int) -> dict:
  evals = {k: v[1:] if len(v) > 1 else v for k, v in history.items()}  # skip round 0
  final = {name: _final_mean(evals[name]) for name in
           ("test_accuracy_mean", "test_accuracy_pooled", "test_accuracy_std",
            "test_accuracy_worst10", "train_loss")}
  final["test_accuracy_sampled_pooled"] = _final_mean([a for _, a in sampled_history])
  return dict(
      **config.metadata, dataset_display_name=data.spec.display_name,
      rounds=config.rounds, wall_time_s=wall_time,
      time_per_round_s=float(np.mean(round_times)) if round_times else float("nan"),
      clients_seen=clients_seen, num_clients=data.num_clients,
      final=final,
      final_protocols={
          "test_accuracy_mean": "all clients, current body and own head, mean over clients",
          "test_accuracy_pooled": "all clients, pooled over test examples",
          "test_accuracy_sampled_pooled":
              "reference code: the round's clients right after their update, pooled",
          "window": f"mean over the last {FINAL_WINDOW} evaluations"},
      partition_manifest=data.manifest_path)


def _write_clients_csv(path: str, table: dict[str, np.ndarray], data: FederatedData):
  writer = outputs.CsvWriter(path, CLIENT_FIELDS)
  for j, client in enumerate(table["client_index"]):
    writer.write(dict(
        client=data.client_ids[client], classes=data.partition.class_sets[client],
        **{k: table[k][j] for k in CLIENT_FIELDS[2:]}))
  writer.close()


def _plot(config: RunConfig, history, sampled_history, data: FederatedData) -> None:
  meta = config.metadata
  title = (f"{meta.get('algorithm', '').upper()} on {data.spec.display_name}, "
           f"{meta.get('personalization', '')} personalization, "
           f"I={data.num_clients}")
  accuracy = {"all clients, mean": (history["round"], history["test_accuracy_mean"]),
              "all clients, worst 10%": (history["round"],
                                         history["test_accuracy_worst10"])}
  if sampled_history:
    rounds, values = zip(*sampled_history)
    accuracy["sampled clients, pooled (ref. code)"] = (rounds, values)
  outputs.plot_curves(os.path.join(config.output_dir, "curves.png"), title,
                      history["round"], history["train_loss"], accuracy,
                      config.reference_accuracy)
