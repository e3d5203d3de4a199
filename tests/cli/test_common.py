"""The commands' logging: the package logs through `logging` (a caller can silence it), and
every command takes --log-level."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

from keras_transformer.cli.common import setup_logging
from keras_transformer.settings.args import TrainArgs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("train", "export", "translate", "evaluate", "score")


class Stats:
    """PipelineStats after a pass that dropped `n` pairs."""

    def __init__(self, n):
        self.too_long = type("Count", (), {"numpy": lambda _: n})()


@pytest.fixture
def package_logger():
    """The `keras_transformer` logger, restored afterwards."""
    logger = logging.getLogger("keras_transformer")
    saved = logger.level, logger.propagate, list(logger.handlers)
    yield logger
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    logger.handlers[:] = saved[2]


def test_a_library_caller_silences_the_package_with_its_logger(package_logger):
    from keras_transformer.training.trainer import report_dropped

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.INFO)
    report_dropped(Stats(3), TrainArgs())
    assert [(r.name, r.levelname, r.getMessage()) for r in records] == [
        (
            "keras_transformer.training.trainer",
            "INFO",
            "dropped 3 training pairs longer than --max-length 128",
        )
    ]
    records.clear()
    package_logger.setLevel(logging.WARNING)  # what a notebook does to quiet the package
    report_dropped(Stats(3), TrainArgs())
    assert records == []


def test_the_commands_logging_shows_info_lines_as_they_were_printed(package_logger):
    from keras_transformer.training.trainer import report_dropped

    stream = io.StringIO()
    setup_logging("INFO", stream)
    report_dropped(Stats(3), TrainArgs())
    logging.getLogger("keras_transformer.training").warning("a warning")
    assert stream.getvalue() == (
        "dropped 3 training pairs longer than --max-length 128\nWARNING: a warning\n"
    )
    setup_logging("WARNING", stream)  # configured again: replaces, does not add, its handler
    report_dropped(Stats(3), TrainArgs())
    assert stream.getvalue().count("dropped") == 1
    assert sum(getattr(h, "kt_command", False) for h in package_logger.handlers) == 1


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_takes_log_level(command):
    run = [sys.executable, "-m", f"keras_transformer.cli.{command}"]
    out = subprocess.run(
        [*run, "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert out.returncode == 0 and "--log-level {DEBUG,INFO,WARNING,ERROR}" in out.stdout
    bad = subprocess.run(
        [*run, "--log-level", "LOUD"], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert bad.returncode == 2 and "--log-level: invalid choice: 'LOUD'" in bad.stderr
