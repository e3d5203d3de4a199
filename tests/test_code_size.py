"""Issue 39's size rule: every package file readable in one sitting, every function on a screen.

For every ``.py`` file under ``keras_transformer/``:

- **file size**: its number of lines (every line: code, docstrings, comments, blank) is at
  most ``MAX_FILE_LINES`` (300);
- **function size**: every function and method (``def`` or ``async def``, nested ones included,
  each measured on its own and also as part of the function around it) spans at most
  ``MAX_FUNCTION_LINES`` (50) lines, counted from its ``def`` line (decorators not counted) to
  its last line, every line included: docstrings, blank lines and comments. This is the
  project's stop hook's measure.

``ALLOWED`` lists the violations that exist today in files other helpers are fixing, each with
the helper that owns it: an entry is a path (the file is too long) or ``path:qualified.name``
(the function is too long). The test fails on any violation not in the list, and on an entry
that is no longer a violation (so the list only shrinks, as the fixes merge).
"""

from __future__ import annotations

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "keras_transformer"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 50

# Today's violations in files that other helpers own; remove an entry when its fix merges.
ALLOWED: dict[str, str] = {}


def _functions(tree: ast.Module):
    """Every function in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from visit(child, name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def function_sizes(source: str) -> dict[str, int]:
    """Lines of every function of ``source``, from its ``def`` line to its last line."""
    return {name: node.end_lineno - node.lineno + 1 for name, node in _functions(ast.parse(source))}


def violations(root: str = REPO) -> dict[str, str]:
    """Every violation under the package: key (path or path:function) -> what it measures."""
    found = {}
    for folder, _, names in os.walk(os.path.join(root, PACKAGE)):
        for name in sorted(names):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as f:
                source = f.read()
            count = len(source.splitlines())
            if count > MAX_FILE_LINES:
                found[relative] = f"{count} lines"
            for function, size in function_sizes(source).items():
                if size > MAX_FUNCTION_LINES:
                    found[f"{relative}:{function}"] = f"{size} lines"
    return found


@pytest.fixture(scope="module")
def found():
    return violations()


def test_no_package_file_or_function_over_the_size_rule(found):
    new = {key: value for key, value in found.items() if key not in ALLOWED}
    assert not new, (
        f"over {MAX_FILE_LINES} lines per file or {MAX_FUNCTION_LINES} lines per function "
        f"(split by responsibility): {new}"
    )


def test_the_allow_list_holds_only_current_violations(found):
    fixed = sorted(key for key in ALLOWED if key not in found)
    assert not fixed, f"no longer a violation, remove it from ALLOWED: {fixed}"


@pytest.mark.parametrize(
    "source, expected",
    [
        # every line from the def line to the last one: docstring, blank lines and comment too
        (
            'def f(x):\n    """Doc.\n\n    More.\n    """\n\n    # note\n    y = x\n'
            "    z = (y,\n         y)\n    return z\n",
            {"f": 11},
        ),
        # a nested function counts in its own size and in the outer one's; the blank line and
        # the comment after the last statement are not part of the function
        (
            'def outer():\n    def inner():\n        """Doc."""\n        return 1\n\n'
            "    return inner\n\n# after\n",
            {"outer": 6, "outer.inner": 3},
        ),
        # a method is named by its class; decorators are not counted; a multi-line string
        # counts every line it spans
        (
            "class A:\n    @property\n    def m(self):\n        x = 1\n"
            '        return """a\n\nb"""\n',
            {"A.m": 5},
        ),
    ],
)
def test_function_sizes_count_every_line_from_def_to_end(source, expected):
    assert function_sizes(source) == expected


def test_a_new_violation_is_reported(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(47))
    # 47 statements after a docstring, a blank line and a comment: 51 lines, 48 of them code
    (package / "long.py").write_text('def f():\n    """Doc."""\n\n    # note\n' + body + "\n" * 260)
    (package / "fine.py").write_text("def g():\n" + body + "    y = 1\n    z = 2\n")
    assert violations(str(tmp_path)) == {
        f"{PACKAGE}/long.py": "311 lines",
        f"{PACKAGE}/long.py:f": "51 lines",
    }
