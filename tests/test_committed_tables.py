"""The tables committed under docs/ are what the records committed beside them give:
each row names its cell's record (what a fresh clone has, not a machine's runs/) and
carries that record's figures under today's definitions (`cells.run_figures`), so a
changed definition or a row kept from an older run cannot sit in the docs unnoticed.
Rows recovered from a table whose runs are gone (`ablate.py --recover_rows_from`) have
no record and are left out."""

from __future__ import annotations

import csv
import glob
import math
import os

import pytest

from tests.helpers import REPO
from tff_pflego import records
from tff_pflego.training import cells

TABLES = ["docs/results.csv"] + sorted(
    os.path.relpath(path, REPO)
    for path in glob.glob(os.path.join(REPO, "docs", "ablation_*.csv")))


def _number(text: str) -> float:
  return math.nan if text in ("", "None") else float(text)


@pytest.mark.parametrize("table", TABLES)
def test_a_committed_table_holds_its_records_figures(table):
  with open(os.path.join(REPO, table), newline="") as f:
    rows = [row for row in csv.DictReader(f)
            if not row["run_dir"].startswith("recovered from ")]
  assert rows or table != "docs/results.csv"
  for row in rows:
    name = f"{table}: {row['run_dir']}"
    assert row["run_dir"].startswith("docs/"), name
    record = os.path.join(REPO, row["run_dir"])
    assert records.finished(record), f"{name}: no finished record there"
    for field, value in cells.run_figures(record).items():
      expected = math.nan if value is None else float(value)
      got = _number(row[field])
      assert (math.isnan(got) and math.isnan(expected)) or math.isclose(
          got, expected, rel_tol=1e-12), f"{name}: {field} {got} != {expected}"
