"""Runs many bad-input cases of the commands in one process tree: TensorFlow and the package
are imported once, then each case runs in a child forked from that process, as
`python <argv>` would run it (`runpy` with `__main__`, its own argv, cwd, environment, stdin,
stdout and stderr file descriptors, exit status from `sys.exit` or an uncaught exception with
its traceback on stderr). A case costs its own work, not the 10-17 s of imports.

`python -m tests.cli_driver jobs.json results.json`: jobs.json is a list of
`{"argv", "stdin" (a file or null), "env", "cwd", "watch" (folders)}`; results.json gets, per
job, `{"returncode", "stdout" (its bytes as latin-1 text), "stderr" (text), "after"}` where
`after` is `snapshot(*watch)` taken as soon as the case ended. Used by
tests/test_cli_failures.py and by the command tests of tests/inference/test_export.py.

`python -m tests.cli_driver --serve SOCKET` serves commands that a shell runs: each
`python tests/cli_client.py SOCKET <argv>` (a process without TensorFlow) hands its argv,
cwd, environment and stdin, stdout and stderr descriptors to this process over the Unix
socket SOCKET, which runs it as above in a forked child and answers its exit status; the
client exits with it. Commands are served one at a time, until the server is terminated.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import socket
import sys
import tempfile
import traceback

# The commands drop TensorFlow's C++ runtime lines of its import and device setup
# (import_tensorflow); here the runtime starts in each child, after that import: level 3 keeps
# those lines off the children's stderr as the commands' own import keeps them off theirs.
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import tensorflow  # noqa: E402, F401

# the commands' heavy modules (not keras_transformer.cli.*: runpy runs those as __main__)
import keras_transformer.inference.evaluation  # noqa: E402, F401
import keras_transformer.inference.export  # noqa: E402, F401
import keras_transformer.training.trainer  # noqa: E402, F401
from tests.cli_contract import snapshot  # noqa: E402


def exit_code(stop: SystemExit) -> int:
    """The status `python` exits with on this SystemExit (None: 0, a message: 1)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def child(job: dict, stdin: int, stdout: int, stderr: int) -> None:
    """The forked child: becomes `python *argv` and exits with its status."""
    code = 1
    try:
        os.chdir(job["cwd"])
        os.environ.clear()
        os.environ.update(job["env"])
        for source, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(source, target)
        sys.stdin = open(0, closefd=False)  # a fresh reader of the new descriptor 0
        argv = job["argv"]
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = exit_code(stop)
        except BaseException:  # noqa: BLE001 - what python prints for an uncaught error
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - closed by the command
                pass
        os._exit(code)


def run(job: dict) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        stdin = os.open(job["stdin"] or os.devnull, os.O_RDONLY)
        pid = os.fork()
        if pid == 0:
            child(job, stdin, out.fileno(), err.fileno())
        os.close(stdin)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {
            "returncode": os.waitstatus_to_exitcode(status),
            "stdout": out.read().decode("latin-1"),
            "stderr": err.read().decode("utf-8", "replace"),
            "after": snapshot(*job["watch"]),
        }


def main(jobs_path: str, results_path: str) -> None:
    with open(jobs_path, encoding="utf-8") as handle:
        jobs = json.load(handle)
    results = [run(job) for job in jobs]
    with open(results_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle)


def serve(socket_path: str) -> None:
    """Runs the commands of tests/cli_client.py, one connection (one command) at a time."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(socket_path)
        server.listen()
        while True:
            connection, _ = server.accept()
            with connection:
                message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
                job = json.loads(message)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    child(job, *fds)
                for fd in fds:
                    os.close(fd)
                _, status = os.waitpid(pid, 0)
                connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        main(*sys.argv[1:])
