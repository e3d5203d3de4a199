"""The failure contract that every command keeps, as a test helper.

On an expected failure (a bad flag, file, value or run directory) a command exits with
status 2 and prints exactly one line on stderr, `<command>: error: <message>`, naming the
flag, file or value and what would fix it. It prints no traceback, and it leaves every file
that existed before it started unchanged. Unexpected errors keep their traceback: they are
bugs, and this helper does not apply to them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# TensorFlow's C++ runtime log lines are not a command's output (the commands drop those of its
# import unless --log-level debug; a user's TF_CPP_MIN_LOG_LEVEL may show others)
from keras_transformer.cli.common import RUNTIME_LOG

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad input to one command.

    `argv` follows `python` (e.g. `["train.py", "--model-dir", "{tmp}/run"]`); the
    placeholders `{tmp}` (the case's own directory), `{data}` (Multi30k), `{run}` (a copy of
    a small trained run) and `{export}` (its SavedModel) are filled in. `setup(tmp)` may
    write files first. `names` must all appear in the one line on stderr.
    """

    id: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    setup: Callable[[Path], None] | None = None
    stdin: bytes | None = None
    env: tuple[tuple[str, str], ...] = ()


def run_command(argv, cwd=ROOT, stdin: bytes | None = None, env=None, timeout=600):
    """Runs `python *argv` from the repo root (as the README does); stdout and stderr as text."""
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        input=stdin if stdin is not None else b"",
        capture_output=True,
        env=environ,
        timeout=timeout,
    )


def snapshot(*roots) -> dict[str, str]:
    """Every file under `roots` with the SHA-256 of its bytes."""
    files = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                files[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def assert_clean_failure(out: subprocess.CompletedProcess, command: str, names) -> str:
    """Exit 2, one line on stderr `<command>: error: ...` naming every one of `names`."""
    stderr = out.stderr.decode("utf-8", "replace")
    lines = [line for line in stderr.splitlines() if line.strip() and not RUNTIME_LOG.match(line)]
    shown = stderr[-3000:]
    assert out.returncode == 2, f"exit {out.returncode}, want 2\n{shown}"
    assert "Traceback" not in stderr, shown
    assert len(lines) == 1, f"{len(lines)} lines on stderr, want one\n{shown}"
    line = lines[0]
    assert line.startswith(f"{command}: error: "), line
    for name in names:
        assert name in line, f"{name!r} not named in: {line}"
    return line


def assert_unchanged(before: dict[str, str], after: dict[str, str]) -> None:
    """No file that existed before the command was changed or removed."""
    changed = [path for path, digest in before.items() if after.get(path) != digest]
    assert not changed, f"changed or removed: {changed}"


__all__ = ["ROOT", "Case", "assert_clean_failure", "assert_unchanged", "run_command", "snapshot"]
