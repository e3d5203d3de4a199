"""`python tests/cli_client.py SOCKET <argv>`: runs `python <argv>` in a child of the
`python -m tests.cli_driver --serve SOCKET` process (TensorFlow already imported there) with
this process's cwd, environment, stdin, stdout and stderr, and exits with its status. Only
the standard library: it starts in a few milliseconds (run it with `python -S`)."""

import json
import os
import socket
import sys
import time


def connect(path: str, timeout: float = 300.0) -> socket.socket:
    """Connected to the server, waiting for it while it imports TensorFlow."""
    deadline = time.monotonic() + timeout
    while True:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            client.connect(path)
            return client
        except (FileNotFoundError, ConnectionRefusedError):
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main(path: str, *argv: str) -> int:
    job = {"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ)}
    with connect(path) as client:
        socket.send_fds(client, [json.dumps(job).encode()], [0, 1, 2])
        code = int(client.recv(64))
    return 128 - code if code < 0 else code  # killed by signal n: the shell's 128 + n


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
