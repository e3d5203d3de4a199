"""Writing files so that a crash never leaves half of one behind."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` to a private temporary file beside `path`, then renames it over `path`.

    The temporary name is unique, so two processes writing the same path never share a
    half-written file; the rename is atomic on POSIX filesystems.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


__all__ = ["write_atomic"]
