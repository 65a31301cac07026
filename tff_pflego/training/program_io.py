"""One event loop, one I/O thread, for every `tff.program` call of the process.

`tff.program`'s managers are coroutines that run their file I/O in the event loop's
default executor. `asyncio.run` makes a new loop, hence a new executor thread, at every
call; each new thread that saves a checkpoint (MBs of tensors through SavedModel) can
draw another glibc malloc arena, and the driver grew ~0.1 MB a round with checkpoints
every 10 rounds and stayed flat without them (docs/round_profile.md, "Memory"). Here
every call runs on one loop whose executor has one thread, reused for the whole run.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from typing import Awaitable, Optional, TypeVar

_T = TypeVar("_T")
_lock = threading.Lock()
_runner: Optional[asyncio.Runner] = None


def run(awaitable: Awaitable[_T]) -> _T:
  """Runs `awaitable` to completion on the process's one program-I/O loop."""
  global _runner
  with _lock:
    if _runner is None:
      _runner = asyncio.Runner()
      _runner.get_loop().set_default_executor(
          concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                thread_name_prefix="program_io"))
      atexit.register(_close)
    return _runner.run(_as_coroutine(awaitable))


async def _as_coroutine(awaitable: Awaitable[_T]) -> _T:
  return await awaitable


def _close() -> None:
  global _runner
  if _runner is not None:
    _runner.close()
    _runner = None
