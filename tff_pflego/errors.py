"""User-facing errors: a mistake in a flag, file, dataset or shape.

Entry points catch `UserError`, print its one-line message and exit with code 2,
without a traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
  """A problem the user can fix (bad flag, missing file, bad dataset...)."""


class DatasetNotFoundError(UserError):
  """A raw dataset file is missing where it is expected."""


class RuntimeFailure(Exception):
  """The run cannot go on for a reason outside the user's input (a worker died...).

  Entry points print its one-line message and exit with code 1; the checkpoint of the
  last completed round is on disk, so the run can be resumed.
  """


class WorkerLostError(RuntimeFailure):
  """A TFF worker process died or became unreachable during a computation."""
