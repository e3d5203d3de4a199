"""Batched translation and sacreBLEU scoring (detokenized, cased), shared by the CLIs.

`translate_all` is the one batched-translation loop: `translate` and `evaluate` call it on
an export's signature, and any in-process `Translator` works the same way.
"""

from __future__ import annotations

import gzip
import logging
import os
import sys

import sacrebleu

from keras_transformer.errors import KerasTransformerError

logger = logging.getLogger(__name__)


class EvaluationError(KerasTransformerError, ValueError):
    """A missing export or mismatched input files; the message names the path."""


GZIP_MAGIC = b"\x1f\x8b"


def read_lines(path: str) -> list[str]:
    """The lines of a plain or gzip UTF-8 file, or of stdin for "-" (invalid bytes replaced
    by U+FFFD either way), without newlines. Gzip is recognized by its first two bytes, so
    `kt-translate < test.en.gz` reads what `--input test.en.gz` reads.

    The rule training reads its files by (`tf.data.TextLineDataset`), for files and stdin
    alike: lines end at "\n" only, and every "\r" is dropped (a CRLF file reads as its LF
    twin; a stray "\r" never splits a line, so N lines in give N translations out).
    """
    if path == "-":
        name, data = "stdin", sys.stdin.buffer.read()
    elif not os.path.isfile(path):
        raise EvaluationError(f"{path} not found")
    else:
        with open(path, "rb") as handle:
            name, data = path, handle.read()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise EvaluationError(f"{name} is not a complete gzip file ({err})") from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        logger.warning(
            "%s is not UTF-8 text (an invalid byte at offset %d; such bytes read as U+FFFD): "
            "give UTF-8 text, plain or gzip",
            name,
            err.start,
        )
    return split_lines(data)


def split_lines(data: bytes) -> list[str]:
    """`data`'s lines by `read_lines`' rule: split at "\n", "\r" dropped, UTF-8 with
    invalid bytes replaced; a last line without "\n" counts."""
    lines = data.decode("utf-8", errors="replace").replace("\r", "").split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def check_output(path: str | None, flag: str = "--output") -> None:
    """Fail now, not after the translating, if `path` cannot be written: its folder must
    exist and be writable, and it must not be a folder."""
    if path is None or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise EvaluationError(f"{flag} {path} is a directory; give a file name")
    if not os.path.isdir(folder):
        raise EvaluationError(f"{flag} {path}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise EvaluationError(f"{flag} {path} is not writable; choose another path")


def write_lines(path: str, lines: list[str]) -> None:
    """Write `lines` (without newlines) to `path`, or to stdout for "-"."""
    text = "".join(line + "\n" for line in lines)
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def load_export(model_path: str, signature: str = "serving_default"):
    """A signature of an exported version directory, loaded with tensorflow_text's ops."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    if not os.path.isfile(os.path.join(model_path, "saved_model.pb")):
        raise EvaluationError(f"no saved_model.pb in {model_path}: is it an export version?")
    signatures = tf.saved_model.load(model_path).signatures
    if signature not in signatures:
        raise EvaluationError(
            f"{model_path} has no {signature!r} signature (it has {sorted(signatures)}): it "
            "was exported by an earlier version; re-export with this version (kt-export)"
        )
    return signatures[signature]


def length_order(sentences: list[str]) -> list[int]:
    """Indices of `sentences`, longest first (words, then characters): batches of similar
    lengths pad little and settle together."""
    return sorted(
        range(len(sentences)), key=lambda i: (-len(sentences[i].split()), -len(sentences[i]))
    )


def report_truncated(truncated: list[bool], what: str = "inputs") -> int:
    """Log (warning) how many of `what` were cut to the export's input limit; that count."""
    count = sum(map(bool, truncated))
    if count:
        logger.warning(
            "%d of %d %s were longer than the export's limit (the model's max_length tokens) "
            "and were cut: their results cover only their beginning",
            count,
            len(truncated),
            what,
        )
    return count


def translate_all(
    translate_fn, sentences: list[str], batch_size: int = 64, truncated=None, **options
) -> tuple[list[str], list[float]]:
    """(translations, scores) of `sentences`, in their order.

    `translate_fn(inputs=(b,) strings, **options)` returns {"outputs", "scores"} with a
    first axis of b (an export's signature or a `Translator` method); an n-best output
    keeps its first hypothesis. Each option is a scalar (the same for every sentence) or a
    list with one value per sentence; either way the signature gets a (b,) vector of its
    dtype (`options.DTYPES`). Inputs are sorted by length, translated in batches of
    `batch_size` and put back in input order; a progress bar goes to stderr when there is
    more than one batch. Inputs cut to the export's input limit (its "truncated" output,
    absent from exports made before it) are counted in a logged warning; `truncated`, a
    list, receives one bool per input, in input order.
    """
    from tqdm import tqdm

    if batch_size < 1:
        raise EvaluationError(f"batch size must be >= 1, got {batch_size}")
    order = length_order(sentences)
    texts: list[str] = [""] * len(sentences)
    scores: list[float] = [0.0] * len(sentences)
    cut: list[bool] = [False] * len(sentences)
    bar = tqdm(
        total=len(sentences),
        unit="sent",
        file=sys.stderr,
        disable=len(sentences) <= batch_size,
        mininterval=1.0,
    )
    with bar:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            got = _translate_rows(translate_fn, sentences, rows, options)
            for i, text, value, flag in zip(rows, *got, strict=True):
                texts[i], scores[i], cut[i] = text, value, flag
            bar.update(len(rows))
    report_truncated(cut)
    if truncated is not None:
        truncated.extend(cut)
    return texts, scores


def _translate_rows(translate_fn, sentences: list[str], rows: list[int], options: dict):
    """(translations, scores, truncated flags) of the sentences at `rows`, as one batch; the
    flags are all False when the export has no "truncated" output."""
    import numpy as np
    import tensorflow as tf

    from keras_transformer.inference.options import DTYPES

    def vector(name, value):
        values = [value[i] for i in rows] if isinstance(value, list) else [value] * len(rows)
        return tf.constant(values, DTYPES[name])

    batch = {name: vector(name, value) for name, value in options.items()}
    out = translate_fn(inputs=tf.constant([sentences[i] for i in rows]), **batch)
    outputs, batch_scores = out["outputs"].numpy(), out["scores"].numpy()
    if outputs.ndim == 2:
        outputs, batch_scores = outputs[:, 0], batch_scores[:, 0]
    texts = [text.decode("utf-8") for text in outputs]
    scores = [float(value) for value in np.asarray(batch_scores)]
    if "truncated" not in out:
        return texts, scores, [False] * len(rows)
    return texts, scores, [bool(flag) for flag in out["truncated"].numpy()]


def score(hypotheses: list[str], references: list[str]) -> dict:
    """BLEU and chrF with their signatures, as a JSON-ready dict."""
    if len(hypotheses) != len(references):
        raise EvaluationError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {
        "bleu": round(bleu_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


def bleu_statistics(hypotheses: list[str], references: list[str]) -> list[int]:
    """sacreBLEU's sufficient statistics of a corpus, or of one part of it: [hypothesis length,
    reference length, matching n-grams for n = 1..4, hypothesis n-grams for n = 1..4] (zeros
    for no sentences). Summed over the parts of a split corpus they are the whole corpus's, so
    `bleu_from_statistics` of the sum is `score`'s BLEU of the whole, exactly."""
    metric = sacrebleu.metrics.BLEU()
    if not hypotheses:
        return [0] * (2 + 2 * metric.max_ngram_order)
    if len(hypotheses) != len(references):
        raise EvaluationError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    result = metric.corpus_score(hypotheses, [references])
    return [result.sys_len, result.ref_len, *result.counts, *result.totals]


def bleu_from_statistics(statistics: list[int]) -> float:
    """The BLEU of `bleu_statistics` (or their sum over the parts of a corpus), rounded as
    `score` rounds it: sacreBLEU's own `BLEU.compute_bleu` with the metric's defaults."""
    metric = sacrebleu.metrics.BLEU()
    n = metric.max_ngram_order
    counts = [int(value) for value in statistics]
    result = metric.compute_bleu(
        correct=counts[2 : 2 + n],
        total=counts[2 + n :],
        sys_len=counts[0],
        ref_len=counts[1],
        smooth_method=metric.smooth_method,
        smooth_value=metric.smooth_value,
        effective_order=metric.effective_order,
        max_ngram_order=n,
    )
    return round(result.score, 2)
