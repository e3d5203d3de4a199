"""The agreement report every export writes: how its outputs compare with the reference's.

The reference is the float32 `Translator` of the same weights with the exact stop rule and
the export's other settings (beam size, alpha, max extra length, min length), run in-process:
the search the default export serves. The export is run as written (the SavedModel loaded
from disk, or the CTranslate2 model), on the first N validation sentences of the run's
dataset (config.json "training": --dataset, languages, --data-dir or KT_DATA_DIR,
--valid-src/--valid-tgt), read with the training data code. The report (JSON):

    {"reference": what was compared against, "export": {"format", "dtype", "stop_rule",
     "quantization"...}, "data": where the sentences came from, "sentences": N,
     "identical": outputs equal to the reference's, "identical_share": identical / N,
     "bleu": {"export", "reference", "delta"}, "chrf": {"export", "reference", "delta"},
     "bleu_signature", "chrf_signature", "seconds": {"export", "reference"},
     "is_reference": true when the export is float32 with the exact rule (the comparison then
     checks that the files written reproduce the in-process search, and the BLEU figures are
     the export's quality on those sentences)}

or {"sentences": 0, "skipped": why} when N is 0 or the run names no validation data.
"""

from __future__ import annotations

import json
import logging
import os
import time

from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import data_dir_from_env

logger = logging.getLogger(__name__)

REPORT_FILE = "agreement.json"
DEFAULT_SENTENCES = 200


def validation_pairs(settings, count: int) -> tuple[list[str], list[str], str]:
    """The first `count` validation pairs of a run whose training settings (`RunConfig.training`,
    None where config.json records none) are `settings`: (sources, references, a
    description). Raises KerasTransformerError when the run names no dataset or the data
    cannot be read."""
    from keras_transformer.data.sources import load_parallel

    dataset = (getattr(settings, "dataset", None) or "").split(",")[0].strip()
    if not dataset:
        raise KerasTransformerError("config.json names no --dataset")
    src, tgt = settings.src_lang, settings.tgt_lang
    data_dir = settings.data_dir or data_dir_from_env()
    files = (settings.valid_src, settings.valid_tgt)
    pairs = load_parallel(
        dataset, "validation", src, tgt, data_dir=data_dir, files=files, tfds_download=False
    )
    sources, references = [], []
    for source, target in pairs.dataset.take(count).as_numpy_iterator():
        sources.append(source.decode("utf-8"))
        references.append(target.decode("utf-8"))
    where = f"{dataset} validation {src}->{tgt}" + (
        f" ({files[0]}, {files[1]})" if dataset == "files" else ""
    )
    return sources, references, f"the first {len(sources)} pairs of {where}"


def skipped(reason: str) -> dict:
    return {"sentences": 0, "skipped": reason}


def compare(
    export_fn, reference_fn, sources: list[str], references: list[str], batch_size: int = 32
) -> dict:
    """Translate `sources` with both (functions of `evaluation.translate_all`) and compare;
    each runs once on two sentences first, so that "seconds" leave out tracing and loading
    (both run in this process, one after the other: a rough figure, not a benchmark)."""
    from keras_transformer.inference.evaluation import score, translate_all

    for fn in (export_fn, reference_fn):
        translate_all(fn, sources[:2], batch_size)

    start = time.perf_counter()
    ours, _ = translate_all(export_fn, sources, batch_size)
    export_seconds = time.perf_counter() - start
    start = time.perf_counter()
    theirs, _ = translate_all(reference_fn, sources, batch_size)
    reference_seconds = time.perf_counter() - start
    identical = sum(a == b for a, b in zip(ours, theirs, strict=True))
    ours_score, theirs_score = score(ours, references), score(theirs, references)
    return {
        "sentences": len(sources),
        "identical": identical,
        "identical_share": round(identical / max(len(sources), 1), 4),
        "bleu": {
            "export": ours_score["bleu"],
            "reference": theirs_score["bleu"],
            "delta": round(ours_score["bleu"] - theirs_score["bleu"], 2),
        },
        "chrf": {
            "export": ours_score["chrf"],
            "reference": theirs_score["chrf"],
            "delta": round(ours_score["chrf"] - theirs_score["chrf"], 2),
        },
        "bleu_signature": ours_score["bleu_signature"],
        "chrf_signature": ours_score["chrf_signature"],
        "seconds": {"export": round(export_seconds, 2), "reference": round(reference_seconds, 2)},
    }


class AgreementReport:
    """Called with an export's path once it is written: the agreement report (a dict) of
    that export, as written, against `reference` (the float32 exact-rule Translator of the
    same weights) on the run's first `sentences` validation sentences; `described`: the
    export's settings ("format", "dtype", "stop_rule", "xla", the search settings)."""

    def __init__(self, model_dir, sentences, *, reference, described, max_input_length):
        self.model_dir = model_dir
        self.sentences = sentences
        self.reference = reference
        self.described = described
        self.max_input_length = max_input_length

    def __call__(self, path: str) -> dict:
        from keras_transformer.run_dir import Run

        if self.sentences <= 0:
            return skipped("--agreement-sentences 0")
        try:
            sources, references, data = validation_pairs(
                Run(self.model_dir).read_run_config().training, self.sentences
            )
        except (KerasTransformerError, OSError) as err:
            return skipped(f"no validation sentences: {err}")
        report = compare(self._exported(path), self.reference.__call__, sources, references)
        export = self.described
        is_reference = (
            export["format"] == "savedmodel"
            and export["dtype"] == "float32"
            and not export.get("xla")
            and export["stop_rule"] == "exact"
            and "finish_rule" not in export
        )
        return {
            "reference": REFERENCE,
            "is_reference": is_reference,
            "export": export,
            "data": data,
            **report,
        }

    def _exported(self, path: str):
        """The written export as a function of strings, as its users call it."""
        if self.described["format"] != "ctranslate2":
            return _load_signature(path)
        from keras_transformer.inference.ctranslate2_export import Decoder

        export = self.described
        return Decoder(
            path, beam_size=export["beam_size"], alpha=export["alpha"],
            max_extra_length=export["max_extra_length"], min_length=export["min_length"],
            max_input_length=self.max_input_length,
        )  # fmt: skip


REFERENCE = (
    "the float32 Translator of the same weights, exact stop rule, the export's other "
    "settings, run in-process (the default export's search)"
)


def _load_signature(path: str):
    """The serving_default signature of the SavedModel written at `path`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    return tf.saved_model.load(path).signatures["serving_default"]


def write_report(directory: str, report: dict) -> str:
    """`report` as `<directory>/agreement.json`; its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, REPORT_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    return path
