"""The scripts of a test module that need a process of their own (2 logical CPUs, XLA flags:
set before TensorFlow starts), run together in one process tree (tests/cli_driver.py:
TensorFlow and the package imported once, each script in a child forked from that process,
before any device is set up), once per module for the tests selected in the session."""

from __future__ import annotations

import json
import os
import subprocess

from tests.training.small_corpus import run_commands

HERE = os.path.dirname(os.path.abspath(__file__))


def selected_tests(request) -> set[str]:
    """The names of the module's tests (without parameters) selected in this session."""
    return {
        item.originalname
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    }


def run_scripts(commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Each named argv (a script: of this folder, or a path; then its arguments) run as `python argv` in one process tree; their outcomes by name."""
    argvs = [[os.path.join(HERE, argv[0]), *argv[1:]] for argv in commands.values()]
    return dict(zip(commands, run_commands(*argvs, check=False) if argvs else []))


def script_result(out: subprocess.CompletedProcess) -> dict:
    """A script's JSON (its last line of stdout); fails the test on a non-zero exit."""
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
