"""The base class of every error medstack reports to a user as a message (not a traceback)."""


class MedstackError(Exception):
    """Bad input or an unmet precondition; the CLI prints the message and exits with status 2."""


class DataError(MedstackError):
    """Input data that cannot be read; the message names the file and the line or record id."""


class StorageError(MedstackError):
    """A write that the disk refused (full, read-only, over a size limit). Before a run starts it is bad
    input (exit 2); mid-run the runner stops starting cases, keeps what finished and exits 3."""

    @classmethod
    def from_os(cls, path, e: OSError, *, hint: str = "") -> "StorageError":
        why = {28: "the disk is full", 30: "the file system is read-only", 27: "the file size limit was reached",
               13: "permission denied", 122: "the disk quota is exceeded"}.get(e.errno, e.strerror or str(e))
        return cls(f"cannot write {path}: {why}" + (f"; {hint}" if hint else ""))
