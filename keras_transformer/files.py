"""Writing files so that a crash never leaves half of one behind."""

from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` to a private temporary file beside `path`, then renames it over `path`.

    The temporary name is unique, so two processes writing the same path never share a
    half-written file; the rename is atomic on POSIX filesystems. A path with a scheme
    (gs://, ram://, ...) goes through `tf.io.gfile` (an object store's rename is a copy:
    readers still never see a half-written file, only the temporary one).
    """
    if "://" in str(path):
        _write_gfile(str(path), data)
        return
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


def _write_gfile(path: str, data: bytes | str) -> None:
    import uuid

    import tensorflow as tf

    folder, name = path.rsplit("/", 1)
    tmp = f"{folder}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with tf.io.gfile.GFile(tmp, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        tf.io.gfile.rename(tmp, path, overwrite=True)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.remove(tmp)
        raise


__all__ = ["write_atomic"]
