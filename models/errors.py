"""The base class of every error medstack reports to a user as a message (not a traceback)."""


class MedstackError(Exception):
    """Bad input or an unmet precondition; the CLI prints the message and exits with status 2."""


class DataError(MedstackError):
    """Input data that cannot be read; the message names the file and the line or record id."""
