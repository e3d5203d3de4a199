"""Small training corpora cut from Multi30k, and the train.py command of a tiny run on them,
for the fine-tuning and EMA tests (a few hundred pairs: SentencePiece trains in a second)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

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


def run_train(model_dir, *flags) -> subprocess.CompletedProcess:
    """train.py with the tiny settings and `flags`; fails the test on a non-zero exit."""
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--model-dir", str(model_dir)]
        + [*TINY, *flags],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    if out.returncode != 0:
        raise AssertionError(out.stderr[-3000:])
    return out


__all__ = ["ROOT", "TINY", "run_train", "write_corpus"]
