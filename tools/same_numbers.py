"""Same seed, same numbers: a short run of every algorithm, before and after a change.

    .venv/bin/python tools/same_numbers.py snapshot --out /tmp/before   # old checkout
    .venv/bin/python tools/same_numbers.py snapshot --out /tmp/after    # new checkout
    .venv/bin/python tools/same_numbers.py compare /tmp/before /tmp/after \
        --report docs/same_numbers.md

`snapshot` runs each algorithm (Fashion-MNIST High, 10 clients, 3 rounds, seed 0) and
keeps its `summary.json` `final` values and every tensor of its last checkpoint, read
with `tf.train.load_checkpoint` (independent of the project's own checkpoint code, so
two versions of the code are read the same way). `compare` says, per algorithm, whether
the final values and the tensors are bit for bit equal, else their largest difference
(the checkpoint's wall time, `elapsed_s`, is left out; `--renamed` maps structure
fields renamed by the change).
Only `experiment.run_experiment` and `ExperimentConfig` fields that both versions share
are used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = dict(dataset="fashion_mnist", personalization="high", num_clients=10, rounds=3,
           eval_every=1, seed=0, progress=False)


def _checkpoint_tensors(output_dir: str) -> dict[str, np.ndarray]:
  import tensorflow as tf
  root = os.path.join(output_dir, "checkpoints")
  last = max(os.listdir(root), key=lambda name: int(name.split("_")[-1]))
  reader = tf.train.load_checkpoint(os.path.join(root, last, "variables", "variables"))
  return {name: np.asarray(reader.get_tensor(name))
          for name in sorted(reader.get_variable_to_shape_map())
          if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")}


def snapshot(out: str, algorithms: list[str], data_dir: str | None) -> None:
  sys.path.insert(0, REPO)
  from tff_pflego import experiment
  os.makedirs(out, exist_ok=True)
  finals = {}
  for name in algorithms:
    with tempfile.TemporaryDirectory() as run_dir:
      extra = dict(data_dir=data_dir) if data_dir else {}
      summary = experiment.run_experiment(experiment.ExperimentConfig(
          algorithm=name, output_dir=run_dir, **RUN, **extra))
      finals[name] = summary["final"]
      tensors = _checkpoint_tensors(run_dir)
    np.savez(os.path.join(out, f"{name}.npz"), **{
        k: v.astype(bytes) if v.dtype == object else v for k, v in tensors.items()})
    print(f"{name}: {len(tensors)} checkpoint tensors", flush=True)
  with open(os.path.join(out, "final.json"), "w") as f:
    json.dump(dict(run=RUN, final=finals), f, indent=1, sort_keys=True)


def _max_difference(a: np.ndarray, b: np.ndarray) -> float:
  if a.shape != b.shape:
    return float("inf")
  if a.dtype.kind not in "fiu":
    return 0.0 if np.array_equal(a, b) else float("inf")
  with np.errstate(invalid="ignore"):
    return float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)),
                           initial=0.0))


# Checkpoint entries that are not numbers the run computes: its wall time so far.
_NOT_COMPUTED = ("elapsed_s",)


def _entries(path: str, renamed: dict[str, str]) -> dict[str, np.ndarray]:
  arrays = np.load(path)
  entries = {}
  for name in arrays.files:
    if any(f"/{skip}/" in f"/{name}" for skip in _NOT_COMPUTED):
      continue
    for old, new in renamed.items():
      name_after = name.replace(f"/{old}/", f"/{new}/")
      if name_after != name:
        break
    else:
      name_after = name
    entries[name_after] = arrays[name]
  return entries


def compare(before: str, after: str, report: str | None, renamed: dict[str, str]) -> int:
  finals = [json.load(open(os.path.join(d, "final.json")))["final"] for d in (before, after)]
  lines = ["| algorithm | `final` values | checkpoint tensors | largest difference |",
           "|---|---|---|---|"]
  failed = False
  for name in sorted(finals[0]):
    if name not in finals[1]:
      lines.append(f"| {name} | missing after | | |")
      failed = True
      continue
    # Values the old version reported must be the same; new metrics are listed.
    added = sorted(set(finals[1][name]) - set(finals[0][name]))
    final_equal = json.dumps(finals[0][name], sort_keys=True) == json.dumps(
        {k: finals[1][name].get(k) for k in finals[0][name]}, sort_keys=True)
    old = _entries(os.path.join(before, f"{name}.npz"), renamed)
    new = _entries(os.path.join(after, f"{name}.npz"), {})
    same_names = sorted(old) == sorted(new)
    bitwise = same_names and all(old[k].tobytes() == new[k].tobytes() for k in old)
    largest = max((_max_difference(old[k], new[k]) for k in old if k in new),
                  default=0.0) if same_names else float("inf")
    final_diff = max((abs(finals[0][name][k] - finals[1][name].get(k, float("nan")))
                      for k in finals[0][name]), default=0.0)
    lines.append(
        f"| {name} | {'bit for bit' if final_equal else f'differ by {final_diff:.2e}'}"
        f"{' (new: ' + ', '.join(added) + ')' if added else ''} "
        f"| {len(new)} tensors, "
        f"{'bit for bit' if bitwise else 'other names' if not same_names else 'differ'} "
        f"| {largest:.2e} |")
    failed |= not (final_equal and bitwise)
  for name in sorted(set(finals[1]) - set(finals[0])):
    lines.append(f"| {name} | new (no before) | | |")
  text = "\n".join(lines)
  print(text)
  if report:
    with open(report, "w") as f:
      f.write(text + "\n")
  return 1 if failed else 0


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  commands = parser.add_subparsers(dest="command", required=True)
  shot = commands.add_parser("snapshot")
  shot.add_argument("--out", required=True)
  shot.add_argument("--algorithms", default="pflego,fedavg,fedprox,fedper,fedrep,"
                    "fedbabu,ditto,fedrecon")
  shot.add_argument("--data_dir", help="prepared data (default: the checkout's data/)")
  comp = commands.add_parser("compare")
  comp.add_argument("before")
  comp.add_argument("after")
  comp.add_argument("--report")
  comp.add_argument("--renamed", default="",
                    help="old=new,...: structure fields renamed by the change")
  args = parser.parse_args()
  if args.command == "snapshot":
    snapshot(args.out, args.algorithms.split(","), args.data_dir)
    return 0
  renamed = dict(pair.split("=") for pair in args.renamed.split(",") if pair)
  return compare(args.before, args.after, args.report, renamed)


if __name__ == "__main__":
  sys.exit(main())
