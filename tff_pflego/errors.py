"""User-facing errors: a mistake in a flag, file, dataset or shape.

Entry points catch `UserError`, print its one-line message and exit with code 2,
without a traceback. Everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
  """A problem the user can fix (bad flag, missing file, bad dataset...)."""


class DatasetNotFoundError(UserError):
  """A raw dataset file is missing where it is expected."""
