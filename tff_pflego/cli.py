"""What every absl entry point shares: one-line errors with exit code 2, no workers left.

`run_main(main)` parses flags with a parser whose mistakes exit 2 with one line, forbids
TFF's implicit worker, turns `UserError` into one line on stderr and exit code 2,
`RuntimeFailure` (a lost worker...) into one line and exit code 1, and a
run stopped by SIGINT/SIGTERM into one line and exit code 128 + signal (130 / 143).
"""

from __future__ import annotations

import signal
import sys
from typing import Callable

from absl import app, flags, logging

from tff_pflego.errors import RuntimeFailure, UserError


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
    if not flags.FLAGS["verbosity"].present:  # INFO logs on request (--verbosity=0)
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
      print(f"error: unexpected positional arguments: {' '.join(argv[1:])}",
            file=sys.stderr)
      sys.exit(2)
    try:
      main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except RuntimeFailure as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
    except BaseException:
      stopped_by = runtime.stop_signal()
      if stopped_by is None:
        raise
      # Whatever the signal's exception turned into on its way up, the run was stopped.
      name = signal.Signals(stopped_by).name
      print(f"stopped by {name}; the outputs written so far are kept", file=sys.stderr)
      sys.exit(128 + stopped_by)

  app.run(guarded, flags_parser=_parse_flags)
