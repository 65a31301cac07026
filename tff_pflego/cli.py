"""What every absl entry point shares: a quiet start, one-line errors with exit code 2,
one line for a stop, no workers left.

Importing this module first (before anything that loads TensorFlow) sets the binary's
logging defaults (TensorFlow's C++ INFO and WARNING lines off unless the user set
`TF_CPP_MIN_LOG_LEVEL`), TensorFlow 2 behaviour for its late import, and makes Ctrl-C
or SIGTERM during start-up print the same one line as later, with no traceback.

`run_main(main)` parses flags with a parser whose mistakes exit 2 with one line, forbids
TFF's implicit worker, turns `UserError` into one line on stderr and exit code 2,
`RuntimeFailure` (a lost worker...) into one line and exit code 1, and a run stopped by
SIGINT/SIGTERM into one line and exit code 128 + signal (130 / 143).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, Optional

from absl import app, flags, logging

from tff_pflego.errors import RuntimeFailure, UserError

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow 2.15 first imported inside absl's `main` (after flag parsing, so that a
# flag mistake is reported before it loads) leaves Keras building eager models on
# graph tensors unless TF2_BEHAVIOR is set: `tf.keras.Sequential([InputLayer,
# Flatten])` fails ("Attempt to convert a value (None)"), and with it every binary
# that builds a body in Python (export.py, train.py --export_dir, benchmark_pflego.py).
os.environ.setdefault("TF2_BEHAVIOR", "1")


def stopped_message(signum: int) -> str:
  return f"stopped by {signal.Signals(signum).name}; the outputs written so far are kept"


def _exit_at_once(signum: int, frame) -> None:
  """Start-up (imports, flag parsing): nothing is written or running yet, so exit."""
  del frame
  sys.stderr.write(stopped_message(signum) + "\n")
  sys.stderr.flush()
  os._exit(128 + signum)


def _exit_at_once_on_stop_signals() -> None:
  for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, _exit_at_once)


_exit_at_once_on_stop_signals()


_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except SystemExit:
    if any(a in _HELP_FLAGS for a in argv[1:]):
      sys.exit(0)  # absl exits 1 after printing the help a user asked for
    raise


def run_main(main: Callable[[list[str]], None],
             check: Optional[Callable[[list[str]], None]] = None,
             tensorflow: bool = True) -> None:
  """Runs `main` under absl: a bad flag or argument is one line and exit 2 before
  TensorFlow loads; a UserError is one line and exit 2, a RuntimeFailure exit 1.

  `check(argv)`, if given, runs after the flags are parsed and before TensorFlow loads
  (it must not load it): the input checks that need no data, so that a UserError it
  raises costs a user a fraction of a second, not TensorFlow's start-up.
  `tensorflow=False`: `main` never loads TensorFlow or TFF (a plotting tool), so no TFF
  worker is forbidden up front and a stop exits at once, as during start-up.
  """

  def guarded(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:  # INFO logs on request (--verbosity=0)
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
      print(f"error: unexpected positional arguments: {' '.join(argv[1:])}",
            file=sys.stderr)
      sys.exit(2)
    try:
      if check is not None:
        check(argv)
      if not tensorflow:
        main(argv)
        return
      from tff_pflego import runtime
      runtime.forbid_implicit_workers()  # also drops TFF's default, which errs at exit
      with runtime.stop_signals_as_exceptions():
        main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except RuntimeFailure as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
    except BaseException:
      runtime = sys.modules.get("tff_pflego.runtime")
      stopped_by = runtime.stop_signal() if runtime is not None else None
      if stopped_by is None:
        raise
      # Whatever the signal's exception turned into on its way up, the run was stopped.
      print(stopped_message(stopped_by), file=sys.stderr)
      sys.exit(128 + stopped_by)

  app.run(guarded, flags_parser=_parse_flags)
