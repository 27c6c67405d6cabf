"""The one error type for mistakes a user can fix. Torch-free.

The command line prints a ``UserError`` as one line naming the file, line or key and the
problem; every other exception is a bug (ours or a library's) and keeps its traceback.
It subclasses ``ValueError`` so that library callers catching bad values keep working.
"""


class UserError(ValueError):
    """Input a user can fix (a file, a line, a key, a flag); the message names it and the problem."""


class UserTypeError(UserError, TypeError):
    """A Python caller's argument of the wrong type (``sentences="text"``, ``sample="yes"``):
    a user's mistake in one line like every other, and still a ``TypeError`` for callers
    that catch one."""
