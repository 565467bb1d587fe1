"""Errors a user can fix. The CLI prints them as one line and exits with status 2; anything else is a bug."""

from accountants.validation import InvalidArgument


class UsageError(InvalidArgument):
    """Bad input to dpaudit itself (an option, a config file, a run directory).

    The message says what is wrong and how to fix it.
    """
