"""Issue 39's size rule: every package file readable in one sitting, every function on a screen.

For every ``.py`` file under ``keras_transformer/``:

- **file size**: its number of lines (every line: code, docstrings, comments, blank) is at
  most ``MAX_FILE_LINES`` (300);
- **function size**: every function and method (``def`` or ``async def``, nested ones included,
  each measured on its own and also as part of the function around it) has at most
  ``MAX_FUNCTION_LINES`` (50) lines of code. Its lines of code are the lines from its ``def``
  line (decorators not counted) to the last line of its body that carry at least part of a
  Python token other than a comment (``tokenize``), so blank lines and comment-only lines do
  not count, and a multi-line string or call counts each line it spans; the lines of the
  docstrings of the function and of every function or class nested in it are then taken off.

``ALLOWED`` lists the violations that exist today in files other helpers are fixing, each with
the helper that owns it: an entry is a path (the file is too long) or ``path:qualified.name``
(the function is too long). The test fails on any violation not in the list, and on an entry
that is no longer a violation (so the list only shrinks, as the fixes merge).
"""

from __future__ import annotations

import ast
import io
import os
import tokenize

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "keras_transformer"
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 50

# Today's violations in files that other helpers own; remove an entry when its fix merges.
ALLOWED = {
    "keras_transformer/cli/export.py": "exportargs",
    "keras_transformer/cli/score.py:main": "decoding",
    "keras_transformer/inference/ctranslate2_export.py:write_ctranslate2": "exportargs",
    "keras_transformer/inference/export.py": "exportargs",
    "keras_transformer/inference/export.py:export_run": "exportargs",
    "keras_transformer/training/callbacks.py": "gpu",
    "keras_transformer/training/trainer.py": "runconfig",
}


def _code_lines(source: str) -> set[int]:
    """The line numbers that carry part of a token other than a comment."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def _docstring_lines(node: ast.AST) -> set[int]:
    """The lines of the docstrings of ``node`` and of every function or class inside it."""
    lines: set[int] = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = inner.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


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
    """Lines of code of every function of ``source`` (see the module docstring)."""
    code = _code_lines(source)
    sizes = {}
    for name, node in _functions(ast.parse(source)):
        span = set(range(node.lineno, node.end_lineno + 1))
        sizes[name] = len((span & code) - _docstring_lines(node))
    return sizes


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
                    found[f"{relative}:{function}"] = f"{size} lines of code"
    return found


@pytest.fixture(scope="module")
def found():
    return violations()


def test_no_package_file_or_function_over_the_size_rule(found):
    new = {key: value for key, value in found.items() if key not in ALLOWED}
    assert not new, (
        f"over {MAX_FILE_LINES} lines per file or {MAX_FUNCTION_LINES} lines of code per "
        f"function (split by responsibility): {new}"
    )


def test_the_allow_list_holds_only_current_violations(found):
    fixed = sorted(key for key in ALLOWED if key not in found)
    assert not fixed, f"no longer a violation, remove it from ALLOWED: {fixed}"


@pytest.mark.parametrize(
    "source, expected",
    [
        # the def line and 3 statements on 4 lines; the docstring, blank lines and comment do not
        (
            'def f(x):\n    """Doc.\n\n    More.\n    """\n\n    # note\n    y = x\n'
            "    z = (y,\n         y)\n    return z\n",
            {"f": 5},
        ),
        # a nested function counts in its own size and in the outer one's; its docstring in neither
        (
            'def outer():\n    def inner():\n        """Doc."""\n        return 1\n\n'
            "    return inner\n",
            {"outer": 4, "outer.inner": 2},
        ),
        # a method is named by its class; decorators are not counted; a string that is not a
        # docstring counts every line it spans
        (
            "class A:\n    @property\n    def m(self):\n        x = 1\n"
            '        return """a\n\nb"""\n',
            {"A.m": 5},
        ),
    ],
)
def test_function_sizes_count_code_lines_only(source, expected):
    assert function_sizes(source) == expected


def test_a_new_violation_is_reported(tmp_path):
    package = tmp_path / PACKAGE
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(50))
    (package / "long.py").write_text("def f():\n" + body + "\n" * 260)
    (package / "fine.py").write_text("def g():\n" + body[: -len("    x49 = 49\n")])
    assert violations(str(tmp_path)) == {
        f"{PACKAGE}/long.py": "311 lines",
        f"{PACKAGE}/long.py:f": "51 lines of code",
    }
