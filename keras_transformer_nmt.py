"""The console scripts of the keras-transformer-nmt distribution (kt-train, kt-export,
kt-translate, kt-evaluate, kt-score, kt-import); the library itself is the import package
`keras_transformer`.

This module sits outside `keras_transformer` on purpose: when another distribution's
`keras_transformer` (PyPI's unrelated `keras-transformer`) is found first on the path, a
command says so in one line instead of failing with a traceback inside the wrong package.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys

DISTRIBUTION = "keras-transformer-nmt"
FIX = (
    "pip uninstall keras-transformer, then, in your checkout of this project, pip install "
    f"--force-reinstall -e . ({DISTRIBUTION} is not on PyPI)"
)


_METADATA = re.compile(
    r"^keras[-_.]transformer-([^-]+?)(-py[^-]*)?\.(dist|egg)-info$", re.IGNORECASE
)


def other_distribution() -> tuple[str, str] | None:
    """(version, metadata directory) of an installed distribution named `keras-transformer`
    that is not this project (PyPI's unrelated package, which installs a `keras_transformer`
    too), or None. This project's own installs from before 0.2.0 were named keras-transformer
    too; they have kt-* commands. (A listing of each sys.path directory: importlib.metadata
    would cost more than all of `import keras_transformer`.)"""
    for root in sys.path:
        try:
            names = os.listdir(root or ".")
        except OSError:
            continue
        for name in names:
            match = _METADATA.match(name)
            if match is None:
                continue
            path = os.path.join(root, name)
            try:
                with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as handle:
                    ours = "kt-" in handle.read()
            except OSError:
                ours = False
            if not ours:
                return match.group(1), path
    return None


def shadowed() -> str | None:
    """Where the `keras_transformer` found first lives, when it is not this distribution's
    (it has no cli/ package); None when it is ours. Nothing is imported to find out."""
    spec = importlib.util.find_spec("keras_transformer")
    if spec is None:
        return "nowhere (keras_transformer is not installed)"
    roots = list(spec.submodule_search_locations or [])
    if any(os.path.isfile(os.path.join(root, "cli", "train.py")) for root in roots):
        return None
    return roots[0] if roots else str(spec.origin)


def run(command: str, entry: str = "main") -> int:
    """The command's `main` (or its function `entry`); one line on stderr (exit 2) instead
    when another distribution's keras_transformer is found first, or breaks ours when it is
    imported."""
    prog = f"kt-{command.rstrip('_')}"  # import_: `import` is a keyword
    where = shadowed()
    if where is not None:
        print(
            f"{prog}: error: the keras_transformer package found first ({where}) is not "
            f"{DISTRIBUTION}'s: another distribution, probably PyPI's unrelated "
            f"keras-transformer, installs the same import package; {FIX}",
            file=sys.stderr,
        )
        return 2
    try:
        module = importlib.import_module(f"keras_transformer.cli.{command}")
    except Exception as err:  # both installed in one directory: their __init__ over ours
        other = other_distribution()
        if other is None:
            raise  # a bug of ours: keep the traceback
        print(
            f"{prog}: error: importing keras_transformer failed ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}) and keras-transformer {other[0]} "
            f"({other[1]}), an unrelated package with the same import package, is installed; "
            f"{FIX}",
            file=sys.stderr,
        )
        return 2
    return getattr(module, entry)(prog=prog)


def train() -> int:
    return run("train", entry="console")  # ends the process without its teardown


def export() -> int:
    return run("export")


def translate() -> int:
    return run("translate")


def evaluate() -> int:
    return run("evaluate")


def score() -> int:
    return run("score")


def import_() -> int:
    return run("import_")
