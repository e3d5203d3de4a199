"""The install name is ours (keras-transformer-nmt, version from keras_transformer), and PyPI's
unrelated keras-transformer, which installs the same import package, is named when present."""

from __future__ import annotations

import os
import subprocess
import sys

import keras_transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code: str, *path, argv=(), cwd=None):
    """`python -c code` with `path` first on sys.path, then the checkout (from `cwd`, by
    default the first of `path`: `python -c` puts the current directory first)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), ROOT])}
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=cwd or (path[0] if path else ROOT),
        env=env,
    )


def test_the_distribution_is_keras_transformer_nmt_with_the_packages_version():
    out = subprocess.run(
        [sys.executable, "setup.py", "--name", "--version"], capture_output=True, text=True,
        cwd=ROOT,
    )  # fmt: skip
    assert out.stdout.split() == ["keras-transformer-nmt", keras_transformer.__version__]
    assert keras_transformer.__version__ == "0.2.0"


def fake_distribution(root, name: str, entry_points: str | None = None):
    info = root / name
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: keras-transformer\n")
    if entry_points is not None:
        (info / "entry_points.txt").write_text(entry_points)


def test_importing_warns_when_pypis_keras_transformer_is_installed(tmp_path):
    fake_distribution(tmp_path / "site", "keras_transformer-0.40.0.dist-info")
    out = python("import keras_transformer", tmp_path / "site")
    assert "keras-transformer 0.40.0 is installed" in out.stderr
    assert "pip uninstall keras-transformer" in out.stderr
    assert "keras-transformer-nmt" in out.stderr
    assert "pip install --force-reinstall -e ." in out.stderr  # not published: no PyPI name
    assert "install keras-transformer-nmt" not in out.stderr
    # this project's own install from before the rename (it has the kt-* commands): no warning
    fake_distribution(
        tmp_path / "old", "keras_transformer-0.1.0.dist-info", "[console_scripts]\nkt-train = x\n"
    )
    out = python("import keras_transformer", tmp_path / "old")
    assert out.returncode == 0 and "is installed" not in out.stderr, out.stderr


def test_a_command_says_so_when_another_keras_transformer_shadows_ours(tmp_path):
    """The console scripts start in keras_transformer_nmt, outside the package: a foreign
    keras_transformer first on the path gets one line naming it and the fix."""
    foreign = tmp_path / "site" / "keras_transformer"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("raise ImportError('the other project')\n")
    code = "import sys, keras_transformer_nmt as k; sys.exit(k.train())"
    out = python(code, tmp_path / "site", argv=["--help"])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(
        f"kt-train: error: the keras_transformer package found first ({foreign})"
    )
    assert "pip uninstall keras-transformer" in lines[0]
    # ours first: the command runs (sys.argv as a console script sees it)
    code = "import sys; sys.argv[0] = 'kt-train'; import keras_transformer_nmt as k; k.train()"
    out = python(code, argv=["--help"])
    assert out.returncode == 0 and out.stdout.startswith("usage: kt-train"), out.stderr


def test_a_command_says_so_when_the_other_packages_files_break_ours(tmp_path):
    """Both installed into one directory: the other's __init__.py over ours (our cli/ is
    there, importing fails). With its distribution present: one line; without: a traceback
    (then it is a bug of ours)."""
    package = tmp_path / "site" / "keras_transformer"
    (package / "cli").mkdir(parents=True)
    (package / "cli" / "train.py").write_text("def main(prog):\n    return 0\n")
    (package / "__init__.py").write_text("from .gelu import gelu\n")
    code = "import sys, keras_transformer_nmt as k; sys.exit(k.train())"
    out = python(code, tmp_path / "site")
    assert out.returncode == 1 and "Traceback" in out.stderr
    fake_distribution(tmp_path / "site", "keras_transformer-0.40.0.dist-info")
    out = python(code, tmp_path / "site")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "importing keras_transformer failed (ModuleNotFoundError" in lines[0]
    assert "keras-transformer 0.40.0" in lines[0] and "pip uninstall keras-transformer" in lines[0]


def test_the_licence_is_apache_2_0_in_the_file_and_the_metadata():
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as handle:
        text = handle.read()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert text.startswith("Copyright 2026 The keras-transformer authors.")
    assert "END OF TERMS AND CONDITIONS" in text
    out = subprocess.run(
        [sys.executable, "setup.py", "--license", "--classifiers"], capture_output=True,
        text=True, cwd=ROOT,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert lines[0] == "Apache-2.0"
    assert "License :: OSI Approved :: Apache Software License" in lines[1:]
