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


def read_utf8(path) -> str:
    """A text file's content as UTF-8 (a leading byte-order mark dropped). Bytes that are not UTF-8 are bad input: a
    DataError naming the file, the line, the byte and its column; a file that cannot be read: StorageError.
    Every CSV and label reader reads through it."""
    try:
        raw = open(path, "rb").read()
    except IsADirectoryError:
        raise DataError(f"{path}: a folder, not a file") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise StorageError.from_os(path, e) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {col}); save the file as UTF-8") from None
