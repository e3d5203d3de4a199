"""Every configuration of bench_gpu.py runs in a child process of its own (its own device
memory peak, its own compilations), killed after `timeout` seconds (an NCCL hang, a
compilation that never ends), and reported with the last lines of its stderr when it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

STDERR_TAIL_LINES = 50


def layers(opts) -> dict:
    """The model's override of its preset: {"num_layers": N} for --num-layers N, else {}."""
    return {"num_layers": opts.num_layers} if opts.num_layers else {}


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_workers(command: list[str], workers: int, timeout: float, row: dict) -> dict:
    """`command` as `workers` local processes of one job (TF_CONFIG: worker 0 is the chief),
    all killed after `timeout` seconds: the chief's JSON with `workers`, or `row` with the
    first failed worker's error and stderr tail (`failed_task`)."""
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(workers)]}
    tasks = []
    for index in range(workers):
        config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # no pipe fills
        env = {**os.environ, "TF_CONFIG": json.dumps(config)}
        tasks.append(
            (subprocess.Popen(command, stdout=out, stderr=err, text=True, env=env), out, err)
        )
    deadline = time.monotonic() + timeout
    timed_out = False
    for proc, _, _ in tasks:
        try:
            proc.wait(timeout=max(0.01, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            for other, _, _ in tasks:
                other.kill()
            break
    results = []
    for index, (proc, out, err) in enumerate(tasks):
        proc.wait()
        out.seek(0)
        err.seek(0)
        results.append((index, proc.returncode, out.read(), err.read()))
    chief = results[0]
    if not timed_out and all(code == 0 for _, code, _, _ in results):
        try:
            return {**json.loads(chief[2].strip().splitlines()[-1]), "workers": workers}
        except (json.JSONDecodeError, IndexError):
            pass
    index, code, _, stderr = next((r for r in results if r[1] != 0), chief)
    lines = tail(stderr)
    error = f"timed out after {timeout:g} s (--timeout): killed" if timed_out else None
    return {
        **row,
        "error": error or (lines[-1] if lines else f"worker {index}: exit {code}, no JSON"),
        "failed_task": f"worker:{index}",
        "stderr_tail": lines,
        "returncode": None if timed_out else code,
        "timed_out": timed_out,
    }
