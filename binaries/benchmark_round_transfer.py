r"""What moving a round's values between the driver and the TFF worker costs, by form.

  python binaries/benchmark_round_transfer.py --rounds=90 --output_dir=docs/...

PFLEGO at the paper's Fashion-MNIST High-Pers setting (I = 100, r = 20, tau = 50,
Adam), one TFF worker, the same sampled clients for every form, each form with its own
server state and clients' states, the forms' order rotating from round to round (the
first round untimed):

  unwrapped       `algorithm.process.next`: every tensor of the result is its own
                  protobuf message, the server state nested four levels deep
  metrics packed  `packed_metrics.with_packed_client_metrics`: each client's metrics
                  leave the runtime as one float64 vector
  driver's round  `packed_metrics.unpacking_next`: metrics packed, and the server state
                  in and out as a flat list of tensors (`flat_server_state`)

Each form's saving is also given as the median over rounds of (the form before's time
minus its own) in the same round. All three compute the same numbers: the run fails
unless their server states and clients' states agree bit for bit, in structure and in
every value, after the last round. Writes
round_transfer.json and round_transfer.png to --output_dir and prints the medians.
"""

from __future__ import annotations

# First: sets the logging defaults and a one-line Ctrl-C before TensorFlow loads.
from tff_pflego import cli  # pylint: disable=g-bad-import-order

import collections
import json
import os
import time

from absl import flags
import numpy as np

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/benchmark_round_transfer",
                                  "Where results go.")
_ROUNDS = flags.DEFINE_integer("rounds", 60, "Timed rounds per form.", lower_bound=1)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")

FORMS = ("unwrapped", "metrics packed", "driver's round")


def _round_forms(process) -> dict:
  from tff_pflego.algorithms import packed_metrics
  packed, unpack = packed_metrics.with_packed_client_metrics(process)

  def metrics_packed(state, data, client_states):
    new_state, new_client_states, metrics = packed.next(state, data, client_states)
    return new_state, new_client_states, unpack(metrics)

  return dict(zip(FORMS, (process.next, metrics_packed,
                          packed_metrics.unpacking_next(process))))


def _identical(a, b) -> bool:
  import tensorflow as tf
  try:
    tf.nest.assert_same_structure(a, b)
  except (ValueError, TypeError):
    return False
  return all(np.array_equal(x, y) for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b)))


def measure(rounds: int) -> dict:
  """Per form: the median and mean round time over `rounds` rounds."""
  from tff_pflego import experiment, runtime
  from tff_pflego.training.client_store import ClientStateStore

  prepared, algorithm = experiment.prepare_training("fashion_mnist", "pflego",
                                                    _DATA_DIR.value)
  data, sampler = prepared.data, prepared.sampler
  with runtime.local_execution_context():
    forms = _round_forms(algorithm.process)
    states = {form: algorithm.process.initialize() for form in forms}
    stores = {form: ClientStateStore(lambda i: algorithm.initial_client_state(
        i, int(data.num_classes[i]))) for form in forms}
    times = collections.defaultdict(list)
    for round_index in range(rounds + 1):
      chosen = sampler.sample()
      ids = [data.client_ids[i] for i in chosen]
      shift = round_index % len(FORMS)
      for form in FORMS[shift:] + FORMS[:shift]:
        start = time.perf_counter()
        states[form], client_states, _ = forms[form](states[form], ids,
                                                     stores[form].get(chosen))
        elapsed = time.perf_counter() - start
        stores[form].update(client_states, chosen)
        if round_index > 0:
          times[form].append(elapsed)
  reference = FORMS[0]
  if not all(_identical(states[f], states[reference])
             and _identical(stores[f].snapshot(), stores[reference].snapshot())
             for f in FORMS[1:]):
    raise SystemExit("the round's forms disagree: a wrapper changed the numbers")
  # Rounds differ in their clients' sizes; a form's saving is best seen round by round.
  saved = {f: float(np.median(np.subtract(times[before], times[f])))
           for before, f in zip(FORMS, FORMS[1:])}
  return dict(rounds=rounds, clients_per_round=len(ids),
              median_saving_over_form_before_s=saved,
              median_round_s={f: float(np.median(times[f])) for f in FORMS},
              mean_round_s={f: float(np.mean(times[f])) for f in FORMS},
              round_s={f: times[f] for f in FORMS})


def plot(path: str, results: dict) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (bars_ax, curve_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
  medians = [1e3 * results["median_round_s"][f] for f in FORMS]
  means = [1e3 * results["mean_round_s"][f] for f in FORMS]
  x = np.arange(len(FORMS))
  bars = bars_ax.bar(x - 0.2, medians, 0.4, label="median", color="tab:blue")
  bars_ax.bar_label(bars, fmt="%.0f")
  bars = bars_ax.bar(x + 0.2, means, 0.4, label="mean", color="tab:gray")
  bars_ax.bar_label(bars, fmt="%.0f")
  bars_ax.set_xticks(x, FORMS)
  bars_ax.set(ylabel="ms per round",
              title=f"PFLEGO, Fashion-MNIST High, r = {results['clients_per_round']}, "
                    f"{results['rounds']} rounds each,\nforms alternating in one worker "
                    "(bit for bit the same numbers)")
  bars_ax.legend(loc="lower right")
  for form in FORMS:
    curve_ax.plot(range(1, results["rounds"] + 1),
                  1e3 * np.asarray(results["round_s"][form]), label=form, lw=1)
  curve_ax.set(xlabel="round (the first untimed)", ylabel="ms", title="Every round")
  curve_ax.legend()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv) -> None:
  del argv
  results = measure(_ROUNDS.value)
  os.makedirs(_OUTPUT_DIR.value, exist_ok=True)
  with open(os.path.join(_OUTPUT_DIR.value, "round_transfer.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(os.path.join(_OUTPUT_DIR.value, "round_transfer.png"), results)
  base = results["median_round_s"][FORMS[0]]
  for form in FORMS:
    median, mean = results["median_round_s"][form], results["mean_round_s"][form]
    print(f"  {form:15s} median {1e3 * median:6.1f} ms  mean {1e3 * mean:6.1f} ms  "
          f"({median / base:.3f}x unwrapped's median)")
  for form, saved in results["median_saving_over_form_before_s"].items():
    print(f"  {form}: {1e3 * saved:.1f} ms less a round than the form before "
          "(median of the rounds' differences)")
  print(f"  the forms' states agreed bit for bit; wrote {_OUTPUT_DIR.value}/"
        "round_transfer.json, round_transfer.png")


if __name__ == "__main__":
  cli.run_main(main)
