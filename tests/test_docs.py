"""The docs say what the code does: their commands parse, they name no path of our machines.

Every command line of a fenced bash block in README.md and docs/*.md that runs one of the
package's commands (`kt-train`, `kt-export`, `kt-translate`, `kt-evaluate`, `kt-score`,
`python train.py`, `python export.py`, `python -m keras_transformer.cli.*`), and of the scripts
in benchmarks/ and serving/, is parsed by that command's own argument parser (its `main`,
stopped right after the parse: nothing is trained, read or written), so a renamed or removed
flag fails here. The dated logs in
docs/experiments/ record commands as they were run, so they are not parsed, but they too must
name no machine path.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import glob
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO

README = os.path.join(REPO, "README.md")
PAGES = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
EVERY_PAGE = [README, os.path.join(REPO, "CHANGELOG.md")] + sorted(
    glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
)
MACHINE_PATHS = ("../shared", "/work/")
README_MAX_LINES = 200

COMMANDS = {
    "kt-train": "train",
    "kt-export": "export",
    "kt-translate": "translate",
    "kt-evaluate": "evaluate",
    "kt-score": "score",
    "kt-import": "import_",
    "train.py": "train",
    "export.py": "export",
}
SCRIPT_DIRS = ("benchmarks", "serving")
WRAPPERS = {"timeout", "nice", "flock", "env", "time"}
SEPARATORS = {"&&", "||", "|", ";", "&"}
REDIRECTIONS = {"<", ">", ">>", "2>", "2>&1"}


def bash_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return re.findall(r"```bash\n(.*?)```", handle.read(), re.S)


def _lex(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def command_lines(block: str) -> list[list[str]]:
    """The simple commands of a bash block: continuations joined (and quotes that span lines),
    comments, environment assignments and redirections dropped, split at `&&`, `|`, `;`."""
    commands = []
    pending = ""
    for line in block.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            tokens = iter(_lex(pending))
        except ValueError:  # a quotation that goes on on the next line
            continue
        pending = ""
        current: list[str] = []
        for token in tokens:
            if token in SEPARATORS:
                commands.append(current)
                current = []
            elif token in REDIRECTIONS:
                next(tokens, None)
            else:
                current.append(token)
        commands.append(current)
    assert not pending, f"unclosed quotation in:\n{pending}"
    return [command for command in commands if command]


def package_command(tokens: list[str]) -> tuple[str, list[str]] | None:
    """(cli module name, argv) when the command runs one of the package's commands."""
    while tokens and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", tokens[0]):
        tokens = tokens[1:]  # KT_DATA_DIR=... kt-train
    if tokens and tokens[0] in WRAPPERS:  # timeout -s KILL 3600 python train.py ...
        starts = [i for i, t in enumerate(tokens) if t in ("python", "python3") or t in COMMANDS]
        tokens = tokens[starts[0] :] if starts else []
    if not tokens:
        return None
    if tokens[0] in ("python", "python3") and len(tokens) > 1:
        if tokens[1] == "-m" and tokens[2].startswith("keras_transformer.cli."):
            return tokens[2].rsplit(".", 1)[1], tokens[3:]
        name, argv = os.path.basename(tokens[1]), tokens[2:]
        if name in ("train.py", "export.py") and tokens[1] == name:  # the checkout's shims
            return COMMANDS[name], argv
        if os.path.dirname(tokens[1]) in SCRIPT_DIRS and name.endswith(".py"):
            return tokens[1], argv  # a script of the checkout, e.g. benchmarks/bench_real.py
        return None
    if tokens[0] in COMMANDS and tokens[0].startswith("kt-"):
        return COMMANDS[tokens[0]], tokens[1:]
    return None


def documented_commands(paths) -> list[tuple[str, str, list[str]]]:
    found = []
    for path in paths:
        for block in bash_blocks(path):
            for tokens in command_lines(block):
                command = package_command(tokens)
                if command:
                    found.append((os.path.relpath(path, REPO), *command))
    return found


class _Parsed(Exception):
    def __init__(self, namespace):
        super().__init__("parsed")
        self.namespace = namespace


def parse_with_the_real_parser(command: str, argv: list[str], monkeypatch) -> None:
    """Runs the command's argument parse (`parse_args` where the module has one, else its
    `main`, stopped right after the parse): `keras_transformer.cli.<command>`, or a script of
    the checkout (`benchmarks/bench_real.py`) given by its path.

    Raises AssertionError with argparse's message when the command line does not parse
    (an abbreviated flag included: it would break as soon as a second flag shares the prefix).
    """
    from keras_transformer.cli import parser as cli_parser

    def stopping(real_parse):
        def parse_and_stop(self, args=None, namespace=None):
            self.allow_abbrev = False  # the docs spell every flag in full
            raise _Parsed(real_parse(self, args, namespace))

        return parse_and_stop

    # argparse's (the scripts') and the commands' own subclass (unknown-flag messages)
    for parser_class in (argparse.ArgumentParser, cli_parser.ArgumentParser):
        monkeypatch.setattr(parser_class, "parse_args", stopping(parser_class.parse_args))
    if command.endswith(".py"):
        path = os.path.join(REPO, command)
        monkeypatch.syspath_prepend(os.path.dirname(path))  # the scripts import their neighbours
        monkeypatch.setattr(sys, "argv", [path, *argv])  # some read sys.argv themselves
        spec = importlib.util.spec_from_file_location(f"_doc_{command}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        run = module.main
    else:
        module = importlib.import_module(f"keras_transformer.cli.{command}")
        # a command's own parse function where it has one (train, export): it cannot go on
        # to train or export, whatever its main does before or after parsing
        run = functools.partial(getattr(module, "parse_args", module.main), argv)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            run()
    except _Parsed:
        return
    except SystemExit as exit_:
        raise AssertionError(
            f"{command} {shlex.join(argv)}: exit {exit_.code}\n{stderr.getvalue()}"
        ) from None
    raise AssertionError(f"{command}: main never parsed its arguments")


def test_every_documented_command_parses_with_its_parser(monkeypatch):
    monkeypatch.chdir(REPO)  # --config recipes/... and the like are paths from a checkout
    monkeypatch.setenv("KT_DATA_DIR", "data")  # a default some flags read
    found = documented_commands([README] + PAGES)
    # the pages show every command; a parser that finds nothing would check nothing
    assert set(COMMANDS.values()) <= {module for _, module, _ in found}, found
    assert {"benchmarks/bench_real.py", "serving/client.py"} <= {c for _, c, _ in found}
    assert len(found) >= 30, len(found)
    failures = []
    for page, module, argv in found:
        try:
            parse_with_the_real_parser(module, argv, monkeypatch)
        except AssertionError as err:
            failures.append(f"{page}: {err}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "line, module",
    [
        ("kt-train --strategy mirrored --no-such-flag 3", "train"),
        ("python train.py --preset huge", "train"),
        ("kt-export --model-dir runs/x --export-dir exports --average-lst 5", "export"),
        ("kt-translate --model m --beams 4 < in.en > out.de", "translate"),
        ("kt-translate --model m --beam 4", "translate"),
        ("kt-evaluate --model m --src a --reference b", "evaluate"),
        ("kt-score --model m --src a", "score"),
        ("python benchmarks/bench_real.py --run r --round 3", "benchmarks/bench_real.py"),
        ("python serving/client.py --grpc localhost:8500 --beams 8 A", "serving/client.py"),
    ],
)
def test_a_command_with_a_wrong_flag_fails_the_check(line, module, monkeypatch):
    """The check can fail: a flag the parser does not know (or a missing required one)."""
    ((_, found_module, argv),) = [(None, *package_command(t)) for t in command_lines(line)]
    assert found_module == module
    with pytest.raises(AssertionError, match="exit 2"):
        parse_with_the_real_parser(module, argv, monkeypatch)


def test_command_lines_are_split_like_bash():
    block = (
        "# a comment\n"
        "KT_DATA_DIR=data python train.py --strategy mirrored   # 65 min\n"
        "python3 -m venv .venv && . .venv/bin/activate && kt-export --model-dir r \\\n"
        "    --export-dir e\n"
        'echo "A man." | kt-translate --model e/t/1 > out.de\n'
        'curl -d \'{"a": 1,\n    "b": 2}\' $URL\n'
        "python -m keras_transformer.cli.score --model m --src a --tgt b\n"
        "timeout -s KILL 3600 python export.py --model-dir r --export-dir e\n"
        "python benchmarks/bench_data.py --data-dir x\n"
        "python tools/other.py --flag\n"
    )
    commands = [package_command(c) for c in command_lines(block)]
    assert [c for c in commands if c] == [
        ("train", ["--strategy", "mirrored"]),
        ("export", ["--model-dir", "r", "--export-dir", "e"]),
        ("translate", ["--model", "e/t/1"]),
        ("score", ["--model", "m", "--src", "a", "--tgt", "b"]),
        ("export", ["--model-dir", "r", "--export-dir", "e"]),
        ("benchmarks/bench_data.py", ["--data-dir", "x"]),
    ]


@pytest.mark.parametrize("path", EVERY_PAGE, ids=lambda p: os.path.relpath(p, REPO))
def test_no_page_names_a_path_of_our_machines(path):
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            for machine_path in MACHINE_PATHS:
                assert machine_path not in line, f"{path}:{number}: {line.strip()}"


def test_the_readme_is_a_short_front_door():
    with open(README, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


# Generated from the flag schema on another branch; until it lands, links to it are expected.
PENDING_PAGES = {os.path.join(REPO, "docs", "configuration.md")}


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def page_anchors(path: str) -> set[str]:
    with open(path, encoding="utf-8") as handle:
        text = re.sub(r"```.*?```", "", handle.read(), flags=re.S)
    return {github_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def test_every_link_between_pages_resolves():
    broken = []
    for page in EVERY_PAGE:
        with open(page, encoding="utf-8") as handle:
            text = re.sub(r"```.*?```", "", handle.read(), flags=re.S)
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link):
                continue  # https://...
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(target):
                if target not in PENDING_PAGES:
                    broken.append(f"{os.path.relpath(page, REPO)}: {link}")
            elif anchor and os.path.isfile(target) and anchor not in page_anchors(target):
                broken.append(f"{os.path.relpath(page, REPO)}: {link} (no such heading)")
    assert not broken, "\n".join(broken)


def python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return re.findall(r"```python\n(.*?)```", handle.read(), re.S)


def promised_prints(block: str) -> list[str]:
    """What the block's `print(...)  # <a Python literal>` lines promise to print."""
    promised = []
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if code.startswith("print(") and comment:
            try:
                promised.append(str(ast.literal_eval(comment)))
            except (ValueError, SyntaxError):
                continue  # prose, e.g. "# the German translation"
    return promised


@pytest.fixture(scope="module")
def readme_directory(tmp_path_factory, multi30k_dir):
    """A directory holding `exports/transformer/1`, a tiny trained run's export, where the
    README's blocks run as a reader would run them after `kt-export` (one layer: the blocks
    load and call an export, whatever its size; its tracing, saving and loading time grows
    with the layers)."""
    from keras_transformer.inference.export import export_run
    from tests.run_fixture import make_run

    base = tmp_path_factory.mktemp("readme")
    run = make_run(str(base / "run"), multi30k_dir, steps=10, num_layers=1)
    export_run(run, str(base / "exports"), max_extra_length=5)
    return str(base)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks(README))))
def test_every_readme_python_block_runs_as_written(index, request, tmp_path):
    """Each ```python block of the README runs in a fresh interpreter, as written (a block that
    reads `exports/transformer/1` runs where a tiny export is), and prints what its comments
    say it prints."""
    block = python_blocks(README)[index]
    cwd = request.getfixturevalue("readme_directory") if "exports/" in block else str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", block], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, f"README block {index}:\n{block}\n{out.stderr[-2000:]}"
    printed = out.stdout.splitlines()
    for promise in promised_prints(block):
        assert promise in printed, (promise, printed)


def test_the_readme_has_python_blocks_that_promise_output():
    blocks = python_blocks(README)
    assert len(blocks) >= 2 and any("exports/" in b for b in blocks)
    assert promised_prints(blocks[0]) == ["(1, 3, 8000)"]
