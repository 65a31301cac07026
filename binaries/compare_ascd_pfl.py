r"""ASCD-PFL beside PFLEGO on PFLEGO's own objective (issue #12, what the paper does not do).

Both minimize L(psi) = sum_i alpha_i l_i(W_i, theta) with the MLP body on Fashion-MNIST,
High personalization (I = 100, r = 20, seed 0): PFLEGO at the paper's settings, ASCD-PFL
(`tff_pflego/algorithms/ascd_pfl.py`) at the best of a tuning grid.

  python binaries/compare_ascd_pfl.py --output_dir=runs/ascd_pfl --docs_dir=docs/ascd_pfl

1. tuning: every (p_w, server_lr, client_lr) of the grid flags for --tune_rounds rounds;
   the lowest all-client train loss L(psi) at the end among all tuning runs found
   (this grid's and earlier invocations') wins (momentum --ascd_momentum);
2. PFLEGO (paper settings), ASCD-PFL at the winner and its momentum-free twin (SCD-PFL,
   c = 0) for --rounds rounds;
3. <docs_dir>/ascd_vs_pflego.png: L(psi) and all-client test accuracy against rounds and
   against client compute (the clients' measured compute seconds, summed over rounds);
   <docs_dir>/results.md and results.json: the tuning table and the final numbers.

Resumable: a run whose summary.json exists is read, not rerun.
"""

from __future__ import annotations

from tff_pflego import cli  # pylint: disable=g-bad-import-order

import itertools
import json
import os

from absl import flags

_OUTPUT_DIR = flags.DEFINE_string("output_dir", "runs/ascd_pfl", "Where the runs go.")
_DOCS_DIR = flags.DEFINE_string("docs_dir", "docs/ascd_pfl", "Figure and tables.")
_ROUNDS = flags.DEFINE_integer("rounds", 200, "Rounds of the compared runs.", lower_bound=1)
_TUNE_ROUNDS = flags.DEFINE_integer("tune_rounds", 60, "Rounds of a tuning run.",
                                    lower_bound=1)
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 10, "All-client evaluation period.",
                                   lower_bound=1)
_P_W = flags.DEFINE_list("p_w", ["0.02", "0.1", "0.5"], "Tuning grid: p_w.")
_SERVER_LR = flags.DEFINE_list("server_lr", ["0.02", "0.1", "0.5"],
                               "Tuning grid: the body's step (SGD, divided by p_w).")
_CLIENT_LR = flags.DEFINE_list("client_lr", ["0.001"],
                               "Tuning grid: the heads' step (divided by (1 - p_w) q).")
_MOMENTUM = flags.DEFINE_float("ascd_momentum", 0.5, "ASCD-PFL's c.", lower_bound=0,
                               upper_bound=0.999)
_Z_STEP = flags.DEFINE_float("ascd_z_step", 2.0, "ASCD-PFL's gamma / eta.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Prepared data (default: data/).")

DATASET, DEGREE, SEED = "fashion_mnist", "high", 0


def _run(name: str, algorithm: str, rounds: int, **settings) -> str:
  from tff_pflego.experiment import ExperimentConfig, has_checkpoint, run_experiment
  directory = os.path.join(_OUTPUT_DIR.value, name)
  if not os.path.exists(os.path.join(directory, "summary.json")):
    print(f"{name}: {rounds} rounds", flush=True)
    config = ExperimentConfig(
        dataset=DATASET, algorithm=algorithm, personalization=DEGREE, seed=SEED,
        rounds=rounds, eval_every=_EVAL_EVERY.value, output_dir=directory,
        sampled_eval=False, refit_eval=False, progress=False,
        overwrite=not has_checkpoint(directory), **settings)
    if _DATA_DIR.value:
      config.data_dir = _DATA_DIR.value
    run_experiment(config)
  return directory


def _rows(path: str) -> list[dict]:
  from tff_pflego.training.release import read_rows
  return read_rows(path)


def _curve(directory: str) -> dict:
  """Evaluations (round, L(psi), accuracy) and cumulative client compute per round."""
  evals = _rows(os.path.join(directory, "metrics.csv"))
  rounds = _rows(os.path.join(directory, "rounds.csv"))
  compute, total = {0: 0.0}, 0.0
  for r in rounds:
    total += r["client_compute_s"] * r["num_reports"]
    compute[int(r["round"])] = total
  with open(os.path.join(directory, "summary.json")) as f:
    summary = json.load(f)
  return dict(rounds=[int(r["round"]) for r in evals],
              train_loss=[r["train_loss"] for r in evals],
              test_accuracy=[r["test_accuracy_mean"] for r in evals],
              client_compute_s=[compute[int(r["round"])] for r in evals],
              settings={k: summary["hyperparameters"][k] for k in (
                  "client_lr", "server_lr", "server_optimizer", "local_steps",
                  "ascd_p_w", "ascd_momentum", "ascd_z_step")},
              time_per_round_s=summary["time_per_round_s"],
              body_passes=summary["body_passes_per_client_round"])


def _tuning_runs() -> dict:
  """Every finished tuning run under --output_dir/tune (this grid's and earlier ones')
  at this --ascd_momentum, --ascd_z_step and --tune_rounds."""
  root, runs = os.path.join(_OUTPUT_DIR.value, "tune"), {}
  for name in sorted(os.listdir(root)):
    if os.path.exists(os.path.join(root, name, "summary.json")):
      curve = _curve(os.path.join(root, name))
      s = curve["settings"]
      if (s["ascd_momentum"], s["ascd_z_step"], curve["rounds"][-1]) == (
          _MOMENTUM.value, _Z_STEP.value, _TUNE_ROUNDS.value):
        runs["tune/" + name] = curve
  return runs


def _name(p_w: float, server_lr: float, client_lr: float, momentum: float) -> str:
  return f"pw{p_w:g}_slr{server_lr:g}_clr{client_lr:g}_c{momentum:g}"


def _label(settings: dict) -> str:
  return (f"p_w={settings['ascd_p_w']:g}, server_lr={settings['server_lr']:g}, "
          f"client_lr={settings['client_lr']:g}, c={settings['ascd_momentum']:g}")


def main(argv) -> None:
  del argv
  grid = list(itertools.product(*(map(float, f.value) for f in (_P_W, _SERVER_LR,
                                                                   _CLIENT_LR))))
  for p_w, server_lr, client_lr in grid:
    _run("tune/" + _name(p_w, server_lr, client_lr, _MOMENTUM.value), "ascd_pfl",
         _TUNE_ROUNDS.value, ascd_p_w=p_w, server_lr=server_lr, client_lr=client_lr,
         ascd_momentum=_MOMENTUM.value, ascd_z_step=_Z_STEP.value)
  tuning = _tuning_runs()
  finite = {k: v for k, v in tuning.items() if v["train_loss"][-1] == v["train_loss"][-1]}
  best = min(finite, key=lambda k: finite[k]["train_loss"][-1])
  chosen = tuning[best]["settings"]
  ascd = dict(ascd_p_w=chosen["ascd_p_w"], server_lr=chosen["server_lr"],
              client_lr=chosen["client_lr"], ascd_z_step=_Z_STEP.value)
  rates = (chosen["ascd_p_w"], chosen["server_lr"], chosen["client_lr"])
  runs = {
      "PFLEGO (paper settings)": _run("pflego", "pflego", _ROUNDS.value),
      "ASCD-PFL (tuned)": _run(_name(*rates, _MOMENTUM.value), "ascd_pfl", _ROUNDS.value,
                               ascd_momentum=_MOMENTUM.value, **ascd),
      "SCD-PFL (the same, c = 0)": _run(_name(*rates, 0.0), "ascd_pfl", _ROUNDS.value,
                                        ascd_momentum=0.0, **ascd),
  }
  curves = {label: _curve(directory) for label, directory in runs.items()}
  os.makedirs(_DOCS_DIR.value, exist_ok=True)
  _plot(curves, os.path.join(_DOCS_DIR.value, "ascd_vs_pflego.png"))
  with open(os.path.join(_DOCS_DIR.value, "results.json"), "w") as f:
    json.dump(dict(tuning=tuning, best=best, runs=curves), f, indent=1)
  _table(tuning, best, curves, os.path.join(_DOCS_DIR.value, "results.md"))
  print(open(os.path.join(_DOCS_DIR.value, "results.md")).read())


def _plot(curves: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), layout="constrained")
  for (label, c), color in zip(curves.items(), ("C3", "C0", "C2")):
    style = dict(color=color, lw=2.2 if label.startswith("PFLEGO") else 1.5, label=label)
    for column, x in enumerate((c["rounds"], c["client_compute_s"])):
      axes[0][column].plot(x, c["train_loss"], **style)
      axes[1][column].plot(x, [100 * a for a in c["test_accuracy"]], **style)
  for column, xlabel in enumerate(("round (= communication)",
                                   "client compute, all clients (s, measured)")):
    axes[0][column].set(yscale="log", ylabel="train loss L(ψ), all clients (log)")
    axes[1][column].set(xlabel=xlabel, ylabel="test accuracy, all clients (%)")
    for row in range(2):
      axes[row][column].grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.suptitle("PFLEGO's objective, MLP body, Fashion-MNIST High (I = 100, r = 20, seed "
               "0): binaries/compare_ascd_pfl.py", fontsize=10)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _table(tuning: dict, best: str, curves: dict, path: str) -> None:
  lines = ["# ASCD-PFL beside PFLEGO on PFLEGO's objective", "",
           f"Fashion-MNIST High, I = 100, r = 20, seed {SEED}; made by "
           "`binaries/compare_ascd_pfl.py`. L(ψ) and test accuracy over all clients; "
           "client compute: the clients' measured compute seconds summed over the run.",
           "", "| run | settings | final L(ψ) | final test accuracy | client compute (s) "
           "| body passes per client and round (fwd / bwd) |", "|---|---|---|---|---|---|"]
  for label, c in curves.items():
    s = c["settings"]
    text = (f"rho={s['server_lr']:g} ({s['server_optimizer']}), beta={s['client_lr']:g}, "
            f"tau={s['local_steps']}" if label.startswith("PFLEGO") else _label(s))
    lines.append(f"| {label} | {text} | {c['train_loss'][-1]:.4f} | "
                 f"{100 * c['test_accuracy'][-1]:.2f} % | {c['client_compute_s'][-1]:.1f} | "
                 f"{c['body_passes']['forward']:.0f} / {c['body_passes']['backward']:.0f} |")
  lines += ["", f"Tuning ({len(tuning)} runs of {_TUNE_ROUNDS.value} rounds; the lowest "
            f"final L(ψ) wins: `{best}`):", "",
            "| settings | L(ψ) at the end | test accuracy |", "|---|---|---|"]
  for name, c in sorted(tuning.items(), key=lambda kv: (kv[1]["train_loss"][-1] !=
                                                        kv[1]["train_loss"][-1],
                                                        kv[1]["train_loss"][-1])):
    lines.append(f"| {_label(c['settings'])} | {c['train_loss'][-1]:.4f} | "
                 f"{100 * c['test_accuracy'][-1]:.2f} % |")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  cli.run_main(main)
