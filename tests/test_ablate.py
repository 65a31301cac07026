"""binaries/ablate.py on a tiny study: the varied value reaches each run, every other
setting is the paper's, the tables hold each run's own numbers, bad values cost nothing."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import ENV, REPO, TRAIN
from tff_pflego.config import paper_defaults
from tff_pflego.training import grid
from tff_pflego.training.release import read_rows

ABLATE = [sys.executable, os.path.join(REPO, "binaries", "ablate.py")]
POINTS = (2, 5)  # clients per round, of I = 5


def _study(prepared: str, out: str, *vary: str) -> list[str]:
  return ABLATE + ["--study=participation", "--dataset=fashion_mnist", "--degree=high",
                   "--algorithms=pflego", "--rounds=3", "--eval_every=1", "--noprogress",
                   f"--data_dir={prepared}", f"--output_dir={out}"] + [
                       f"--vary={v}" for v in vary]


def _digests(path: str) -> dict[str, bytes]:
  return {os.path.join(root, name): open(os.path.join(root, name), "rb").read()
          for root, _, files in os.walk(path) for name in files}


def test_a_study_runs_each_point_with_the_papers_other_settings(prepared, tmp_path):
  out = str(tmp_path / "ablate")
  vary = ("clients_per_round=" + ",".join(map(str, POINTS)), "num_clients=5")
  first = subprocess.run(_study(prepared, out, *vary), env=ENV, capture_output=True,
                         text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]

  study = os.path.join(out, "participation", "fashion_mnist_high_T3")
  rows = {int(r["clients_per_round"]): r
          for r in grid.read_results(os.path.join(study, "results.csv"))}
  assert sorted(rows) == list(POINTS)
  paper = paper_defaults("fashion_mnist", "pflego", "high")
  with open(os.path.join(study, "results.md")) as f:
    table = f.read()
  for r in POINTS:
    run_dir = os.path.join(study, "pflego", f"clients_per_round={r}+num_clients=5", "seed0")
    rounds = read_rows(os.path.join(run_dir, "rounds.csv"))
    assert [row["num_selected"] for row in rounds] == [r] * 3  # the value reached the run
    with open(os.path.join(run_dir, "config.json")) as f:
      settings = json.load(f)
    assert (settings["num_clients"], settings["client_lr"], settings["server_lr"],
            settings["local_steps"]) == (5, paper.client_lr, paper.server_lr,
                                         paper.local_steps)
    evals = [row["test_accuracy_mean"]
             for row in read_rows(os.path.join(run_dir, "metrics.csv")) if row["round"] > 0]
    sampled = [row["test_accuracy_sampled_pooled"] for row in rounds]
    assert rows[r]["accuracy_mean"] == pytest.approx(np.mean(evals), abs=1e-12)
    assert rows[r]["sampled_pooled_mean"] == pytest.approx(np.mean(sampled), abs=1e-12)
    assert (f"{100 * np.mean(evals):.2f} ± {100 * np.std(evals):.2f} (shortened: T=3)"
            in table)
  assert os.path.exists(os.path.join(study, "ablation.png"))

  before = _digests(out)
  again = subprocess.run(_study(prepared, out, *vary), env=ENV, capture_output=True,
                         text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("done, skipped") == len(POINTS)
  assert _digests(out) == before

  # Another value later joins the same tables; the earlier cells' rows are kept.
  more = subprocess.run(_study(prepared, out, "clients_per_round=3", "num_clients=5") +
                        ["--cache_head_features"],
                        env=ENV, capture_output=True, text=True, timeout=900)
  assert more.returncode == 0, more.stderr[-3000:]
  cached = {}
  for r in (2, 3):
    with open(os.path.join(study, "pflego", f"clients_per_round={r}+num_clients=5",
                           "seed0", "config.json")) as f:
      cached[r] = json.load(f)["cache_head_features"]
  assert cached == {2: False, 3: True}  # the flag reaches the cells it ran
  rows_now = grid.read_results(os.path.join(study, "results.csv"))
  assert sorted(int(r["clients_per_round"]) for r in rows_now) == [2, 3, 5]
  assert {k: v for k, v in rows_now[0].items()} == rows[2]
  with open(os.path.join(study, "results.md")) as f:
    assert ("| algorithm | clients_per_round=2 | clients_per_round=3 | "
            "clients_per_round=5 |") in f.read()
  before = _digests(out)

  # A bad value is refused before any cell runs; the finished study is untouched.
  bad = subprocess.run(_study(prepared, out, "clients_per_round=2,9", "num_clients=5"),
                       env=ENV, capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2
  assert bad.stderr.strip() == "error: --clients_per_round must be in 1..--num_clients=5, got 9"
  assert _digests(out) == before


@pytest.mark.parametrize("vary, message", [
    (["seed=1,2"], "--vary: 'seed' cannot be varied"),
    (["client_lr=fast"], "--vary: client_lr takes float values, got 'fast'"),
    (["client_lr=0.1,0"], "--vary: --client_lr must be > 0, got 0.0"),
    (["local_steps=5,5"], "--vary: local_steps repeats a value in '5,5'"),
    (["local_steps"], "--vary wants name=v1,v2,..., got 'local_steps'"),
    (["local_steps=5", "local_steps=6"], "--vary: local_steps given twice"),
    (["local_steps=5", "client_lr=1", "server_lr=1"], "--vary: at most two settings"),
])
def test_bad_vary_is_one_line_and_exit_2(tmp_path, vary, message):
  out = str(tmp_path / "nothing")
  result = subprocess.run(_study(str(tmp_path), out, *vary), env=ENV,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
  assert not os.path.exists(out)


def test_a_choice_is_varied_and_the_study_outlives_its_runs(prepared, tmp_path):
  """A setting with choices (the server rate's schedule) is varied like a number; with
  --docs_dir each finished cell is kept as a record, and on a fresh clone (no runs) the
  same command runs nothing and redraws the same tables from the records."""
  out, docs = tmp_path / "ablate", tmp_path / "docs"
  args = ABLATE + ["--study=server_rate", "--dataset=fashion_mnist", "--degree=high",
                   "--rounds=3", "--eval_every=1", "--noprogress",
                   "--vary=server_lr_schedule=constant,cosine", "--vary=num_clients=5",
                   f"--data_dir={prepared}", f"--output_dir={out}", f"--docs_dir={docs}"]
  first = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=900)
  assert first.returncode == 0, first.stderr[-3000:]

  study = os.path.join(str(out), "server_rate", "fashion_mnist_high_T3")
  rows = {r["server_lr_schedule"]: r for r in grid.read_results(
      os.path.join(study, "results.csv"), text_fields=("server_lr_schedule",))}
  assert sorted(rows) == ["constant", "cosine"]
  losses = {}
  for schedule in ("constant", "cosine"):
    where = os.path.join("pflego", f"server_lr_schedule={schedule}+num_clients=5", "seed0")
    run_dir, record = os.path.join(study, where), os.path.join(
        str(docs), "ablations", "server_rate", "fashion_mnist_high_T3", where)
    with open(os.path.join(run_dir, "config.json")) as f:
      assert json.load(f)["server_lr_schedule"] == schedule  # the value reached the run
    evals = [row for row in read_rows(os.path.join(run_dir, "metrics.csv"))
             if row["round"] > 0]
    assert rows[schedule]["refit_mean"] == pytest.approx(
        np.mean([row["test_accuracy_refit_mean"] for row in evals]), abs=1e-12)
    assert rows[schedule]["train_loss_last"] == evals[-1]["train_loss"]
    losses[schedule] = [row["train_loss"] for row in evals]
    assert read_rows(os.path.join(record, "metrics.csv")) == read_rows(
        os.path.join(run_dir, "metrics.csv"))  # the record keeps the run's rows
  # Round 1 runs at rho under both schedules; the cosine's rounds 2-3 at less.
  assert losses["constant"][0] == losses["cosine"][0]
  assert losses["constant"][1:] != losses["cosine"][1:]
  table = (docs / "ablation_server_rate_fashion_mnist_high_T3.md").read_text()
  assert ("| algorithm | server_lr_schedule=constant | server_lr_schedule=cosine |"
          in table)
  assert "## all clients after a head refit" in table
  cosine = rows["cosine"]
  assert (f"{cosine['train_loss_last']:.3g} / {cosine['train_loss_largest_rise']:.2f}x / "
          f"{cosine['train_loss_refit_final']:.3g}") in table

  kept = grid.read_results(str(docs / "ablation_server_rate_fashion_mnist_high_T3.csv"),
                           text_fields=("server_lr_schedule",))
  assert sorted(r["run_dir"] for r in kept) == sorted(  # the records (in git), not the runs
      os.path.join(str(docs), "ablations", "server_rate", "fashion_mnist_high_T3", "pflego",
                   f"server_lr_schedule={s}+num_clients=5", "seed0")
      for s in ("constant", "cosine"))

  shutil.rmtree(out)  # a fresh clone: the records are in git, the runs are not
  again = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert again.stdout.count("done, skipped") == 2 and "running" not in again.stdout
  assert (docs / "ablation_server_rate_fashion_mnist_high_T3.md").read_text() == table

  # --tables_only leaves out the cells never run (num_clients=6) instead of running them.
  shutil.rmtree(out)
  tables = subprocess.run(
      [a.replace("--vary=num_clients=5", "--vary=num_clients=5,6") for a in args]
      + ["--tables_only"], env=ENV, capture_output=True, text=True, timeout=900)
  assert tables.returncode == 0, tables.stderr[-3000:]
  assert tables.stdout.count("done, skipped") == 2 and "running" not in tables.stdout
  assert not any("num_clients=6" in path for path, _, _ in os.walk(tmp_path))
  assert (docs / "ablation_server_rate_fashion_mnist_high_T3.md").read_text() == table


OLD_TABLE = """# Ablation `participation`: participation rate r = clients_per_round / I

fashion_mnist, high; every other setting the paper's; test accuracy (%) at T = 3 (shortened: the paper's T is 200); mean ± std over the last 10 evaluations, or over seeds (n=).

## all clients

| algorithm | clients_per_round=2 | clients_per_round=5 |
|---|---|---|
| pflego num_clients=5 | 91.25 ± 0.50 (shortened: T=3) | — |

## sampled clients

| algorithm | clients_per_round=2 | clients_per_round=5 |
|---|---|---|
| pflego num_clients=5 | 93.10 ± 1.20 (shortened: T=3) | 94.00 ± 0.80 (shortened: T=3) |
"""


def test_a_table_whose_rows_were_never_kept_is_recovered_not_replaced(tmp_path):
  """A --docs_dir table written before its .csv was kept: a study refuses to replace
  it (one line, exit 2, before any cell), --recover_rows_from reads its cells into the
  .csv and the redrawn table holds the same cells; a table that does not fit is refused."""
  out, docs = tmp_path / "ablate", tmp_path / "docs"
  docs.mkdir()
  table = docs / "ablation_participation_fashion_mnist_high_T3.md"
  table.write_text(OLD_TABLE)
  args = _study(str(tmp_path), str(out), "clients_per_round=2,5", "num_clients=5") + [
      f"--docs_dir={docs}"]
  refused = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2
  assert refused.stderr.strip() == (
      f"error: {table} has no .csv of its rows beside it, so this study would replace "
      f"its table; keep them first: the same command with --recover_rows_from={table}")
  assert table.read_text() == OLD_TABLE and not out.exists()

  recovered = subprocess.run(args + [f"--recover_rows_from={table}"], env=ENV,
                             capture_output=True, text=True, timeout=300)
  assert recovered.returncode == 0, recovered.stderr[-3000:]
  rows = {int(r["clients_per_round"]): r for r in grid.read_results(
      str(docs / "ablation_participation_fashion_mnist_high_T3.csv"))}
  assert sorted(rows) == [2, 5]
  with open(docs / "ablation_participation_fashion_mnist_high_T3.csv") as f:
    raw = list(csv.DictReader(f))  # an int setting stays written as one
  assert sorted((r["clients_per_round"], r["num_clients"]) for r in raw) == [
      ("2", "5"), ("5", "5")]
  assert [rows[2][k] for k in ("accuracy_mean", "accuracy_std", "sampled_pooled_mean",
                               "sampled_pooled_std", "num_clients", "seed", "rounds")] == [
      pytest.approx(0.9125), pytest.approx(0.005), pytest.approx(0.931),
      pytest.approx(0.012), 5, 0, 3]
  assert rows[5]["accuracy_mean"] is None
  assert rows[5]["sampled_pooled_mean"] == pytest.approx(0.94)
  redrawn = table.read_text()
  assert redrawn.startswith(OLD_TABLE)  # the same cells, then the sections it lacked

  kept = (docs / "ablation_participation_fashion_mnist_high_T3.csv").read_text()
  shutil.rmtree(out)  # a fresh clone: the rows are kept in --docs_dir only
  stale = tmp_path / "stale.md"  # the same cells with other numbers: the kept rows win
  stale.write_text(OLD_TABLE.replace("91.25", "50.00").replace("94.00", "10.00"))
  again = subprocess.run(args + [f"--recover_rows_from={stale}"], env=ENV,
                         capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert (docs / "ablation_participation_fashion_mnist_high_T3.csv").read_text() == kept
  assert table.read_text() == redrawn

  for wrong, message in ((OLD_TABLE.replace("`participation`", "`tau`"),
                          "holds study tau on fashion_mnist high"),
                         (OLD_TABLE.replace("94.00 ± 0.80", "94.00 ± 0.80 (n=3)"),
                          "a mean over seeds cannot be split into its seeds"),
                         (OLD_TABLE.replace("clients_per_round=5 |", "clients_per_round=x |"),
                          "clients_per_round takes int values, got 'x'")):
    other = tmp_path / "other.md"
    other.write_text(wrong)
    result = subprocess.run(args + [f"--recover_rows_from={other}"], env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


PLOT_PROBE = """
import importlib.util, json, os, sys
from matplotlib.colors import to_hex
import matplotlib.pyplot as plt
spec = importlib.util.spec_from_file_location("ablate", sys.argv[1])
ablate = importlib.util.module_from_spec(spec)
sys.modules["ablate"] = ablate  # dataclasses resolve their module by name
spec.loader.exec_module(ablate)
ablate.flags.FLAGS(["ablate", "--study=participation", "--output_dir=" + sys.argv[2]])
figures = []
plt.close = figures.append  # keep what plot() closes (and "all", from matplotlib.use)
algorithms = ("pflego", "fedper", "fedavg")
plan = ablate.Plan("participation", "fashion_mnist", "high", algorithms,
                   (("clients_per_round", (2, 5)),), (0,), 200, 200)
rows = [dict(dataset="fashion_mnist", degree="high", algorithm=a, seed=0,
             clients_per_round=r, rounds=200, paper_rounds=200,
             accuracy_mean=0.9 + 0.01 * i, accuracy_std=0.001,
             sampled_pooled_mean=0.91 + 0.01 * i, sampled_pooled_std=0.002)
        for i, a in enumerate(algorithms) for r in (2, 5)]
os.makedirs(plan.directory)
ablate.plot(plan, rows)
print(json.dumps([dict(
    legend=ax.get_legend_handles_labels()[1] if ax.get_legend() else [],
    algorithms={c.get_label(): to_hex(c.lines[0].get_color()) for c in ax.containers},
    paper=[[l.get_label(), to_hex(l.get_color())] for l in ax.get_lines()
           if l.get_label().startswith("paper")]) for ax in figures[-1].axes]))
"""


def test_the_figure_draws_each_papers_figure_once_in_its_algorithms_color(tmp_path):
  """On both accuracy panels one dashed line per algorithm at the paper's figure, in
  the algorithm's color; the legend lists each once."""
  result = subprocess.run(
      [sys.executable, "-c", PLOT_PROBE, os.path.join(REPO, "binaries", "ablate.py"),
       str(tmp_path)], env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  panels = json.loads(result.stdout.strip().splitlines()[-1])
  from tff_pflego.config import PAPER_ACCURACY
  algorithms = ("pflego", "fedper", "fedavg")
  paper = [f"paper: {a} {100 * PAPER_ACCURACY[('fashion_mnist', a, 'high')]:.2f}"
           for a in algorithms]
  assert len(panels) == 2
  assert panels[0]["legend"] == paper + list(algorithms)
  for panel in panels:  # all clients, sampled
    colors = panel["algorithms"]
    assert sorted(colors) == sorted(algorithms) and len(set(colors.values())) == 3
    assert panel["paper"] == [[label, colors[a]] for label, a in zip(paper, algorithms)]


def test_a_run_outside_the_study_joins_it_only_where_it_fits(prepared, tmp_path):
  """--against: a finished train.py run (the grid's constant-rate cell, scored at
  another cadence) joins a study of the cosine rate at the values its config holds,
  with its own numbers, marked; a run that differs in a setting its figures depend on,
  is unfinished, stands where a cell does, or trained on another partition is refused
  (one line, exit 2) and nothing is written."""
  outside = tmp_path / "grid_cell"
  trained = subprocess.run(TRAIN + [
      "--dataset=fashion_mnist", "--num_clients=5", "--rounds=3", "--eval_every=3",
      f"--data_dir={prepared}", f"--output_dir={outside}", "--noprogress"],
      env=ENV, capture_output=True, text=True, timeout=900)
  assert trained.returncode == 0, trained.stderr[-3000:]
  out, docs = tmp_path / "ablate", tmp_path / "docs"
  study = ABLATE + ["--study=server_rate", "--dataset=fashion_mnist", "--degree=high",
                    "--rounds=3", "--eval_every=1", "--noprogress", f"--data_dir={prepared}",
                    f"--output_dir={out}", f"--docs_dir={docs}"]
  cosine = study + ["--vary=server_lr_schedule=cosine", "--vary=num_clients=5"]

  def refused(args: list[str], message: str) -> None:
    before = _digests(str(docs)) if docs.exists() else None
    result = subprocess.run(args, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [f"error: --against {message}"]
    assert (_digests(str(docs)) if docs.exists() else None) == before

  def copy(name: str, edit: str, change) -> str:
    path = tmp_path / name
    shutil.copytree(outside, path)
    with open(path / edit) as f:
      content = json.load(f)
    change(content)
    with open(path / edit, "w") as f:
      json.dump(content, f)
    return str(path)

  other_lr = copy("other_lr", "config.json", lambda c: c.update(client_lr=0.5))
  paper_lr = paper_defaults("fashion_mnist", "pflego", "high").client_lr
  refused(cosine + [f"--against={other_lr}"],
          f"{other_lr}: its client_lr is 0.5, the study's cell at "
          f"server_lr_schedule=constant+num_clients=5 has {paper_lr}")
  unfinished = tmp_path / "unfinished"
  shutil.copytree(outside, unfinished)
  os.remove(unfinished / "summary.json")
  refused(cosine + [f"--against={unfinished}"],
          f"{unfinished}: not a finished run (summary.json is missing)")
  refused(study + ["--vary=server_lr_schedule=constant", "--vary=num_clients=5",
                   f"--against={outside}"],
          f"{outside}: a cell of the study stands at its server_lr_schedule=constant, "
          "num_clients=5")
  twin = copy("twin", "config.json", lambda c: None)
  refused(cosine + [f"--against={outside},{twin}"],
          f"{twin}: {outside} stands at its server_lr_schedule=constant, num_clients=5")
  assert not docs.exists() and not out.exists()

  joined = subprocess.run(cosine + [f"--against={outside}"], env=ENV,
                          capture_output=True, text=True, timeout=900)
  assert joined.returncode == 0, joined.stderr[-3000:]
  table_path = docs / "ablation_server_rate_fashion_mnist_high_T3.md"
  table = table_path.read_text()
  assert "| algorithm | server_lr_schedule=constant | server_lr_schedule=cosine |" in table
  evals = [row["test_accuracy_mean"] for row in read_rows(
      str(outside / "metrics.csv")) if row["round"] > 0]
  assert len(evals) == 3  # every round of the last 10 is scored, whatever --eval_every
  assert (f"| pflego num_clients=5 | {100 * np.mean(evals):.2f} ± "
          f"{100 * np.std(evals):.2f} (shortened: T=3) † |") in table
  assert (f"† not a cell of the study: `{outside}` (all clients scored every 3 rounds, "
          "the study's every 1") in table
  rows = {r["server_lr_schedule"]: r for r in grid.read_results(
      str(docs / "ablation_server_rate_fashion_mnist_high_T3.csv"),
      text_fields=("server_lr_schedule",))}
  with open(outside / "summary.json") as f:
    fingerprint = json.load(f)["data_provenance"]["partition_fingerprint"]
  assert rows["constant"]["outside_study"] == 1 and not rows["cosine"]["outside_study"]
  losses_line = [line for line in table.split("## L(ψ)")[1].splitlines()
                 if line.startswith("| pflego num_clients=5 |")]
  assert [cell.strip().endswith("†") for cell in losses_line[0].split("|")[2:4]] == [
      True, False]  # the L(psi) table marks the outside run's entry only
  assert rows["constant"]["partition_fingerprint"] == fingerprint
  assert rows["cosine"]["partition_fingerprint"] == fingerprint  # the same clients

  def other_partition(summary: dict) -> None:
    summary["data_provenance"]["partition_fingerprint"] = "f" * 64
  elsewhere = copy("elsewhere", "summary.json", other_partition)
  refused(cosine + [f"--against={elsewhere}"],
          f"{elsewhere}: trained on partition ffffffffffff, the study's cell "
          f"{rows['cosine']['run_dir']} on {fingerprint[:12]}")

  again = subprocess.run(cosine, env=ENV, capture_output=True, text=True, timeout=900)
  assert again.returncode == 0, again.stderr[-3000:]
  assert table_path.read_text() == table  # the outside run's row is kept
