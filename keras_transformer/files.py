"""Writing files so that a crash (of the process or of the node) never leaves half of one
behind, with the modes the umask allows (as `open` and `os.makedirs` give), never the private
ones of `tempfile`."""

from __future__ import annotations

import os
import tempfile

from keras_transformer.errors import KerasTransformerError

# The environment variable of the local data directory (--data-dir's default): read here only.
DATA_DIR_ENV = "KT_DATA_DIR"


def data_dir_from_env() -> str | None:
    """$KT_DATA_DIR as an absolute path (resolved against the current directory), or None."""
    value = os.environ.get(DATA_DIR_ENV)
    return os.path.abspath(value) if value else None


class PathError(KerasTransformerError, ValueError):
    """An output path that cannot be written; the message names the flag."""


def check_writable_dir(path: str, flag: str) -> None:
    """Raise PathError naming `flag` unless `path` is a directory this process can write, or
    can be made one (its nearest existing ancestor is a writable directory). Nothing is
    created: a command checks its output paths before its long work, not after."""
    if "://" in str(path):  # gs://, hdfs://, ram://...: tf.io.gfile's, checked when written
        return
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise PathError(f"{flag} {path} is a file; give a directory (new or existing)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise PathError(f"{flag} {path} is not writable; choose another directory")
        return
    ancestor = os.path.dirname(path)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise PathError(
            f"{flag} {path} cannot be created: {ancestor} is a file; choose another directory"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PathError(
            f"{flag} {path} cannot be created: {ancestor} is not writable; choose another directory"
        )


def current_umask() -> int:
    """The process's umask (read from /proc where it can be, so it is never changed)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, then put it back
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode `os.makedirs` gives a new directory: 0o777 less the umask."""
    return 0o777 & ~current_umask()


def make_public_dir(path: str) -> None:
    """Give a directory made by `tempfile.mkdtemp` (0700) the mode the umask allows, so a
    directory renamed into place from it reads as one made by `os.makedirs`."""
    os.chmod(path, dir_mode())


def write_atomic(path: str, data: bytes | str) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it over `path`.

    The temporary name is unique, so two processes writing the same path never share a
    half-written file; the rename is atomic on POSIX filesystems. The file gets the mode the
    umask allows (0644 under umask 022), not mkstemp's 0600: a server running as another
    user (TF Serving reading models.config, a colleague reading config.json) can read it.
    A local file is fsynced before the rename and its directory after it, so a node that
    crashes (power, kernel) just after a write finds the new file or the old one, whole.
    A path with a scheme (gs://, ram://, ...) goes through `tf.io.gfile` (an object store's rename is a copy:
    readers still never see a half-written file, only the temporary one).
    """
    if "://" in str(path):
        _write_gfile(str(path), data)
        return
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())  # the data on disk before the name points to it
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(folder)  # the rename itself on disk


def fsync_dir(folder: str) -> None:
    """Flush a directory's entries (a rename into it) to disk; a no-op where directories
    cannot be opened (Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


__all__ = [
    "DATA_DIR_ENV",
    "data_dir_from_env",
    "PathError",
    "check_writable_dir",
    "current_umask",
    "dir_mode",
    "file_mode",
    "fsync_dir",
    "make_public_dir",
    "write_atomic",
]
