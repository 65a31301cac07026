"""What every absl entry point shares: one-line errors with exit code 2, no workers left.

`run_main(main)` parses flags with a parser whose mistakes exit 2 with one line, forbids
TFF's implicit worker, and turns `UserError` into one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags

from tff_pflego.errors import UserError


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


def run_main(main: Callable[[list[str]], None]) -> None:
  from tff_pflego import runtime
  runtime.forbid_implicit_workers()  # also drops TFF's default, which errs at exit

  def guarded(argv: list[str]) -> None:
    if len(argv) > 1:
      print(f"error: unexpected positional arguments: {' '.join(argv[1:])}",
            file=sys.stderr)
      sys.exit(2)
    try:
      main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(guarded, flags_parser=_parse_flags)
