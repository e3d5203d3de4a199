"""Small training corpora cut from Multi30k, and the train.py command of a tiny run on them,
for the fine-tuning and EMA tests (a few hundred pairs: SentencePiece trains in a second).
`run_commands` runs several commands in one process tree (tests/cli_driver.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = (
    "--preset", "tiny", "--vocab-size", "400", "--max-length", "32", "--batch-tokens", "512",
    "--eval-sentences", "8", "--eval-beam-size", "1", "--verbose", "0", "--warmup-steps", "10",
)  # fmt: skip


def lines(multi30k_dir: str, name: str, start: int, stop: int) -> list[str]:
    with gzip.open(os.path.join(multi30k_dir, name), "rt", encoding="utf-8") as handle:
        return [line for i, line in enumerate(handle) if start <= i < stop]


def write_corpus(directory, multi30k_dir: str, start: int, stop: int) -> list[str]:
    """Writes train.{en,de} (Multi30k train lines [start, stop)) and valid.{en,de} (the
    first 20 validation lines) to `directory`; returns the --dataset files flags."""
    os.makedirs(directory, exist_ok=True)
    flags = ["--dataset", "files"]
    for split, source, first, last in (("train", "train", start, stop), ("valid", "val", 0, 20)):
        for lang in ("en", "de"):
            path = os.path.join(directory, f"{split}.{lang}")
            with open(path, "w", encoding="utf-8") as handle:
                handle.writelines(lines(multi30k_dir, f"{source}.{lang}.gz", first, last))
            flags += [f"--{split}-{'src' if lang == 'en' else 'tgt'}", path]
    return flags


def train_argv(model_dir, *flags) -> list[str]:
    """The arguments of `python` for train.py with the tiny settings and `flags`."""
    return [os.path.join(ROOT, "train.py"), "--model-dir", str(model_dir), *TINY, *flags]


def run_train(model_dir, *flags) -> subprocess.CompletedProcess:
    """train.py with the tiny settings and `flags`; fails the test on a non-zero exit."""
    out = subprocess.run(
        [sys.executable, *train_argv(model_dir, *flags)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    if out.returncode != 0:
        raise AssertionError(out.stderr[-3000:])
    return out


def run_commands(
    *commands, env=None, envs=None, stdins=None, check=True
) -> list[subprocess.CompletedProcess]:
    """Runs `python *argv` for each argv of `commands`, in order, in one process tree
    (tests/cli_driver.py: TensorFlow and the package are imported once, each command runs in
    a child forked from that process), each as `run_train` runs it; their outcomes, stdout
    and stderr as text. A command costs its own work, not the import's 6-10 s. `env`: added
    to every command's environment, `envs`: one dict (or None) per command added to its own,
    `stdins`: one file (or None: /dev/null) per command, read as its stdin. `check`: fails
    the test on the first non-zero exit."""
    environ = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    none = [None] * len(commands)
    jobs = [
        {"argv": [str(a) for a in argv], "stdin": stdin and str(stdin),
         "env": {**environ, **(extra or {})}, "cwd": ROOT, "watch": []}
        for argv, extra, stdin in zip(commands, envs or none, stdins or none, strict=True)
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        jobs_path, results_path = os.path.join(work, "jobs.json"), os.path.join(work, "out.json")
        with open(jobs_path, "w", encoding="utf-8") as handle:
            json.dump(jobs, handle)
        driver = subprocess.run(
            [sys.executable, "-m", "tests.cli_driver", jobs_path, results_path],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=environ,
        )
        if driver.returncode != 0:
            raise AssertionError(driver.stderr[-3000:])
        with open(results_path, encoding="utf-8") as handle:
            results = json.load(handle)
    outs = [
        subprocess.CompletedProcess(
            job["argv"],
            result["returncode"],
            result["stdout"].encode("latin-1").decode("utf-8", "replace"),
            result["stderr"],
        )
        for job, result in zip(jobs, results)
    ]
    for out in outs:
        if check and out.returncode != 0:
            raise AssertionError(out.stderr[-3000:])
    return outs


__all__ = ["ROOT", "TINY", "run_commands", "run_train", "train_argv", "write_corpus"]
