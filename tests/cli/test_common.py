"""The commands' logging: the package logs through `logging` (a caller can silence it), and
every command takes --log-level."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

from keras_transformer.cli import common
from keras_transformer.cli.common import setup_logging
from keras_transformer.settings.args import TrainArgs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("train", "export", "translate", "evaluate", "score", "import_")


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
    from keras_transformer.training.streams import report_dropped

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.INFO)
    report_dropped(Stats(3), TrainArgs())
    assert [(r.name, r.levelname, r.getMessage()) for r in records] == [
        (
            "keras_transformer.training.streams",
            "INFO",
            "dropped 3 training pairs longer than --max-length 128",
        )
    ]
    records.clear()
    package_logger.setLevel(logging.WARNING)  # what a notebook does to quiet the package
    report_dropped(Stats(3), TrainArgs())
    assert records == []


def test_the_commands_logging_shows_info_lines_as_they_were_printed(package_logger):
    from keras_transformer.training.streams import report_dropped

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


def test_set_up_command_logs_at_its_level_to_stdout_then_imports_tensorflow(
    package_logger, capsys, monkeypatch
):
    imported = []
    monkeypatch.setattr(common, "import_tensorflow", imported.append)
    common.set_up_command("WARNING")
    assert imported == ["WARNING"]
    logging.getLogger("keras_transformer.training").info("not shown")
    logging.getLogger("keras_transformer.training").warning("shown")
    assert capsys.readouterr().out == "WARNING: shown\n"


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


def command(*argv: str) -> subprocess.CompletedProcess:
    """`python *argv` from the checkout, text output."""
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_prints_its_version(name):
    from keras_transformer import __version__

    out = command("-m", f"keras_transformer.cli.{name}", "--version")
    prog = f"kt-{name.rstrip('_')}"  # cli/import_.py is kt-import
    assert (out.returncode, out.stdout, out.stderr) == (0, f"{prog} {__version__}\n", "")


def test_kt_export_version_with_a_number_still_numbers_the_export():
    from keras_transformer.cli.export import parse_args

    assert parse_args(["--model-dir", "r", "--export-dir", "e", "--version", "3"]).version == 3
    assert parse_args(["--model-dir", "r", "--export-dir", "e"]).version is None


# fairseq's and Marian's habits, and typos: argparse would take the first two for the flag
# they begin (--lr 0.0005 as --lr-scale 0.0005, a 1,600x smaller learning rate)
UNKNOWN_FLAGS = [
    ("train", ("--lr", "0.0005"), "unknown flag --lr; did you mean --lr-scale?"),
    ("train", ("--epoch", "3"), "unknown flag --epoch; did you mean --epochs?"),
    ("train", ("--lable-smoothing=0.1",), "unknown flag --lable-smoothing; did you mean "
     "--label-smoothing?"),
    ("export", ("--model-dir", "r", "--export-dir", "e", "--average", "3"),
     "unknown flag --average; did you mean --average-last?"),
    ("export", ("--model-dir", "r", "--export-dir", "e", "--beam", "3"),
     "unknown flag --beam; did you mean --beam-size?"),
    ("translate", ("--model", "m", "--beam", "3"), "unknown flag --beam; did you mean "
     "--beam-size?"),
    ("score", ("--model", "m", "--src", "s", "--tgt", "t", "--zzz"), "unknown flag --zzz"),
]  # fmt: skip


@pytest.mark.parametrize("name, argv, message", UNKNOWN_FLAGS, ids=[m for _, _, m in UNKNOWN_FLAGS])
def test_flags_are_never_abbreviated_and_an_unknown_one_names_the_closest(name, argv, message):
    out = command("-m", f"keras_transformer.cli.{name}", *argv)
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"kt-{name}: error: {message} (see kt-{name} --help)\n"
