r"""How far a finished run's heads are from what its body allows: every client refits
its head on the run's last body, from its stored head or from zero, for a number of
full-batch head steps, and is scored on its train (L(psi)) and test data.

  python binaries/refit_probe.py --run_dir=runs/reproduce/cifar10/medium/pflego/seed0 \
      --steps=49,490 --starts=stored,zero

The evaluation's refit protocol is `--steps=tau-1 --starts=stored` (the steps a sampled
client takes, at the client rate beta and with the run's head optimizer). Reads the run's
latest checkpoint (refused if it belongs to another run); writes refit_probe.json into
--run_dir and prints a table. Clients never sampled keep their initial heads.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import json
import os

from absl import flags

from tff_pflego.errors import UserError

_RUN_DIR = flags.DEFINE_string("run_dir", None, "A finished (or checkpointed) run.",
                               required=True)
_STEPS = flags.DEFINE_list("steps", ["49"], "Head steps of each refit.")
_STARTS = flags.DEFINE_list("starts", ["stored", "zero"],
                            "Where each refit starts: a client's stored head, or zero.")
STARTS = ("stored", "zero")


def probe(run_dir: str, steps: list[int], starts: list[str]) -> dict:
  import numpy as np
  from tff_pflego import experiment, runtime
  from tff_pflego.training import driver, evaluation

  config = experiment.load_run_config(run_dir, "--run_dir")
  prepared = experiment.prepare(config)
  data = prepared.data
  with runtime.local_execution_context():
    algorithm = experiment.training_algorithm(config.algorithm, prepared.algorithm_config)
    run = driver.checkpoint_manager(algorithm, data, run_dir,
                                    prepared.fingerprint).load_latest()
    indices = np.arange(data.num_clients)
    stored = [run.client_states.get(int(i)) or algorithm.initial_client_state(
        int(i), int(data.num_classes[i])) for i in indices]
    zero = [dict(s, head={k: np.zeros_like(v) for k, v in s["head"].items()})
            for s in stored]
    body = algorithm.body_weights(run.server_state)
    results = {}
    for count in steps:
      refit = evaluation.HeadRefit(count, config.client_lr, config.head_optimizer)
      evaluate = driver.build_client_evaluation(algorithm, data, refit=refit)
      for start in starts:
        summary = evaluation.summarize(
            evaluate(body, indices, stored if start == "stored" else zero))
        result = dict(start=start, steps=count, train_loss=summary["train_loss_refit"],
                      test_accuracy_mean=summary["test_accuracy_refit_mean"])
        results[f"{start}/{count}"] = result
        print(f"  from {start:6s} heads, {count:5d} steps: L(psi) "
              f"{result['train_loss']:.4f}, test accuracy "
              f"{100 * result['test_accuracy_mean']:.2f} %")
  return dict(run_dir=run_dir, round=run.round_num, client_lr=config.client_lr,
              head_optimizer=config.head_optimizer, results=results)


def main(argv) -> None:
  del argv
  starts = [s for s in _STARTS.value if s not in STARTS]
  if starts:
    raise UserError(f"--starts: unknown {starts}; choose from {list(STARTS)}")
  try:
    steps = [int(s) for s in _STEPS.value]
  except ValueError:
    raise UserError(f"--steps must be integers, got {_STEPS.value}") from None
  if any(s < 0 for s in steps):
    raise UserError(f"--steps must be >= 0, got {steps}")
  result = probe(_RUN_DIR.value, steps, _STARTS.value)
  path = os.path.join(_RUN_DIR.value, "refit_probe.json")
  with open(path, "w") as f:
    json.dump(result, f, indent=2)
  print(f"  wrote {path}")


if __name__ == "__main__":
  cli.run_main(main)
