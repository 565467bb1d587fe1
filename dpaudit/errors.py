"""Errors a user can fix. The CLI prints them as one line and exits with status 2."""


class UsageError(ValueError):
    """Bad input: the message says what is wrong and how to fix it."""
