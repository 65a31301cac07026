"""`release.CsvRows`: appended rows read back exactly; new columns keep earlier rows."""

from __future__ import annotations

import csv
import math

from tff_pflego.training import release


def test_rows_are_appended_and_read_back(tmp_path):
  path = str(tmp_path / "rounds.csv")
  rows = release.CsvRows(path)
  for key in range(1, 4):
    rows.append(key, {"loss": 0.5 / key, "clients": 20})
  # A second writer (a resumed run) appends under the same header.
  release.CsvRows(path).append(4, {"loss": float("nan"), "clients": 19})
  with open(path, newline="") as f:
    assert next(csv.reader(f)) == ["round", "loss", "clients"]
  got = release.read_rows(path)
  assert [r["round"] for r in got] == [1, 2, 3, 4]
  assert [r["loss"] for r in got[:3]] == [0.5, 0.25, 0.5 / 3]
  assert math.isnan(got[3]["loss"]) and got[3]["clients"] == 19


def test_a_row_with_new_columns_rewrites_with_their_union(tmp_path):
  path = str(tmp_path / "metrics.csv")
  rows = release.CsvRows(path)
  rows.append(0, {"acc": 0.5})
  rows.append(10, {"acc": 0.75, "acc_se": 0.01})
  rows.append(20, {"acc": 0.8})
  got = release.read_rows(path)
  assert [(r["round"], r["acc"]) for r in got] == [(0, 0.5), (10, 0.75), (20, 0.8)]
  assert math.isnan(got[0]["acc_se"]) and got[1]["acc_se"] == 0.01
  assert math.isnan(got[2]["acc_se"])
