"""Every configuration of bench_gpu.py runs in a child process of its own (its own device
memory peak, its own compilations), killed after `timeout` seconds (an NCCL hang, a
compilation that never ends), and reported with the last lines of its stderr when it fails.
"""

from __future__ import annotations

import json
import subprocess
import sys

STDERR_TAIL_LINES = 50


def tail(text: str | bytes | None, lines: int = STDERR_TAIL_LINES) -> list[str]:
    """The last `lines` lines of a child's output (bytes after a timeout: decoded)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return (text or "").rstrip().splitlines()[-lines:]


def run_child(command: list[str], timeout: float, row: dict) -> dict:
    """The JSON of the last stdout line of `command`, or `row` with the failure: `error`
    (one line), `stderr_tail` (the last `STDERR_TAIL_LINES` lines), `returncode` (None after
    a timeout) and `timed_out`."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:  # subprocess.run has killed the child
        return {
            **row,
            "error": f"timed out after {timeout:g} s (--timeout): killed",
            "stderr_tail": tail(expired.stderr),
            "returncode": None,
            "timed_out": True,
        }
    lines = out.stdout.strip().splitlines()
    if out.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    stderr = tail(out.stderr)
    return {
        **row,
        "error": stderr[-1] if stderr else f"exit {out.returncode} and no JSON on stdout",
        "stderr_tail": stderr,
        "returncode": out.returncode,
        "timed_out": False,
    }


def child_command(script: str, argv: list[str], kind: str, **overrides) -> list[str]:
    """`script` run again with `argv`, the `overrides` (flag=value) and `--child kind`."""
    args = list(argv)
    for name, value in overrides.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return [sys.executable, script, *args, "--child", kind]
