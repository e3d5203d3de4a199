"""CI runs the README's test command itself, byte for byte; only the data directory is set."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO

CI_SCRIPT = os.path.join(REPO, ".ci", "run")


def readme_quick_start_lines() -> list[str]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "no bash block in the README's Quick start"
    return block.group(1).splitlines()


def readme_test_command() -> str:
    lines = [line for line in readme_quick_start_lines() if "pytest" in line]
    assert len(lines) == 1, lines
    return lines[0]


def script_lines() -> list[str]:
    with open(CI_SCRIPT, encoding="utf-8") as handle:
        return handle.read().splitlines()


def test_ci_runs_the_readme_test_command_verbatim():
    command = readme_test_command()
    assert command.startswith("python3 -m venv .venv && ") and command.endswith(
        " && python -m pytest -n 2 --dist loadfile"
    )
    executed = [line.split(" || status=$?")[0] for line in script_lines()]
    assert executed.count(command) == 1, f"{CI_SCRIPT} does not run the README's line:\n{command}"
    # Besides the README's line, the one pytest invocation is its cluster step (`-m cluster`,
    # the tests the README's command deselects), so a paraphrase cannot hide beside it.
    others = [
        line for line in executed if "-m pytest" in line and line != command and line[:1] != "#"
    ]
    assert others == ["python -m pytest -n 2 --dist loadfile -m cluster"], others


def test_ci_sets_only_the_data_directory_and_fails_on_any_exit_code():
    lines = [line for line in script_lines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines)
    # the data directory is CI's own fact, set once before the README's line, never inside it
    exports = [line for line in lines if line.startswith("export ")]
    assert exports == ["export KT_DATA_DIR=../shared/data"], exports
    assert lines.index(exports[0]) < next(i for i, x in enumerate(lines) if "-m pytest" in x)
    assert "KT_DATA_DIR" not in readme_test_command()
    for name in ("KT_OFFLINE", "KT_NOTEBOOK_FAST"):
        assert name not in text, name
    assert "set -euo pipefail" in text
    assert os.access(CI_SCRIPT, os.X_OK)


def test_ci_status_handling_fails_on_exit_code_5(tmp_path):
    """Run the script with the README's line replaced by a pytest that collects nothing."""
    command = readme_test_command()
    fake = "\n".join(
        line.replace(
            command, "python -m pytest -q -p no:xdist -k no_such_test_name " + str(tmp_path)
        )
        for line in script_lines()
    ).replace('cd "$(dirname "$0")/.."', f"cd {REPO}")
    (tmp_path / "test_nothing.py").write_text("def test_x():\n    pass\n")
    out = subprocess.run(
        ["bash", "-c", fake], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert out.returncode == 5, out.stdout[-2000:] + out.stderr[-2000:]
    assert "collected no tests" in out.stderr


def test_the_tests_fail_with_a_clear_message_without_kt_data_dir(tmp_path):
    """No KT_DATA_DIR: a test that needs Multi30k fails (no skip, no download) and says why."""
    (tmp_path / "test_needs_data.py").write_text(
        "def test_needs_data(multi30k_dir):\n    assert multi30k_dir\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KT_DATA_DIR"}
    env["PYTHONPATH"] = REPO
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "tests.conftest"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_needs_data.py")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "1 error" in out.stdout and "skipped" not in out.stdout
    assert "KT_DATA_DIR is not set: point it at the directory holding multi30k/" in out.stdout


def test_ci_builds_the_docs_site_strictly_after_the_tests():
    """The docs site is its own step after the README's test command: the `docs` extra, then
    `mkdocs build --strict` (a warning fails CI) into a throwaway directory."""
    lines = [line for line in script_lines() if not line.lstrip().startswith("#")]
    tests = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    install = lines.index('pip install -e ".[docs]"')
    build = lines.index('mkdocs build --strict --site-dir "$(mktemp -d)"')
    assert tests < install < build
    with open(os.path.join(REPO, "mkdocs.yml"), encoding="utf-8") as handle:
        assert re.search(r"^docs_dir: docs$", handle.read(), re.M)
