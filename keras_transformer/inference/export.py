"""SavedModel export in TensorFlow Serving's layout (or a CTranslate2 model, --format).

    <export_dir>/models.config
    <export_dir>/<model_name>/<version>/saved_model.pb
                                       variables/
                                       assets/spm.model
                                       assets.extra/tf_serving_warmup_requests
                                       assets.extra/agreement.json

Signatures: `serving_default` (inputs: string (None,) -> outputs: string (None,), scores:
float32 (None,)), `translate_nbest` (outputs and scores of shape (None, beam)) and
`translate_with_options` (inputs plus per-sentence (None,) beam_size, alpha, max_extra_length,
num_hypotheses, target_prefix -> outputs and scores of shape (None, the largest
num_hypotheses)), `translate_with_stop_rule` (the same plus stop_rule), `score` and `sample`
(see `Translator`); every one also returns
"truncated" (None,) bool, the inputs cut to the model's length. An `xla` export adds
`xla_warmup` (shapes (None, 5) int32 -> shapes), which its warmup requests call. The graph
holds only TensorFlow and TensorFlow Text ops (an `xla` export: also a function compiled by
XLA, which the server must allow). Variables are tracked through
`keras.export.ExportArchive`, so TF1-style session loaders (TF Serving's) find them.
models.config and the warmup file: `serving_layout`. agreement.json compares the export
with the reference search (`agreement`).
"""

from __future__ import annotations

import os

import keras

from keras_transformer.config import (
    ALPHA,
    AVERAGE_LAST,
    BEAM_SIZE,
    FINISH_RULE,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
    STOP_RULE,
)
from keras_transformer.inference import agreement as agree
from keras_transformer.inference import serving_layout as layout
from keras_transformer.inference import xla_search
from keras_transformer.inference.agreement import skipped, write_report
from keras_transformer.inference.options import (
    OPTIONS,
    SAMPLE,
    SCORE,
    STOP_RULE_OPTIONS,
    STRINGS,
    XLA_SHAPES,
)
from keras_transformer.inference.serving_layout import describe_export, write_models_config
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import Run, load_trained
from keras_transformer.settings.decoding import write_options
from keras_transformer.settings.export_args import (
    DTYPES_EXPORT,
    FORMATS,
    XLA_MAX_BATCH,
    ExportArgs,
    ExportError,
)


def export_translator(
    translator: Translator,
    export_dir: str,
    *,
    model_name: str = "transformer",
    version: int | None = None,
    base_path: str | None = None,
    agreement=None,
    write=None,
    xla_max_batch: int = XLA_MAX_BATCH,
) -> str:
    """Write `translator` as `<export_dir>/<model_name>/<version>/`; returns that path.

    The version directory appears whole or not at all (`serving_layout.write_version`); an
    existing version is never overwritten. `agreement(staging path)` -> the agreement
    report (dict, see `agreement`), written as assets.extra/agreement.json before the
    rename; default: a report saying none was made. `write(translator, staging path)`
    replaces the SavedModel writer (`--format ctranslate2`; models.config is then left as
    it is). A `Translator(xla=True)` gets warmup requests that compile its search for
    requests of up to `xla_max_batch` sentences.
    """

    def fill(staging: str) -> None:
        if write is None:
            _write_saved_model(translator, staging, model_name, xla_max_batch)
        else:
            write(translator, staging)
        report = agreement(staging) if agreement else skipped("no validation sentences given")
        write_report(os.path.join(staging, "assets.extra"), report)

    final = layout.write_version(os.path.join(export_dir, model_name), version, fill)
    if write is None:
        write_models_config(export_dir, model_name, base_path or f"/models/{model_name}")
    return final


def _write_saved_model(
    translator: Translator, path: str, model_name: str, xla_max_batch: int = XLA_MAX_BATCH
) -> None:
    archive = keras.export.ExportArchive()
    archive.track(translator.model)
    archive.track(translator.tokenizer)  # the SentencePiece resource
    endpoints = [
        ("serving_default", translator.__call__, [STRINGS]),
        ("translate_nbest", translator.translate_nbest, [STRINGS]),
        ("translate_with_options", translator.translate_with_options, OPTIONS),
        ("translate_with_stop_rule", translator.translate_with_stop_rule, STOP_RULE_OPTIONS),
        ("score", translator.score, SCORE),
        ("sample", translator.sample, SAMPLE),
    ]
    if translator.xla:
        endpoints.append(("xla_warmup", translator.xla_warmup, [XLA_SHAPES]))
    for name, fn, signature in endpoints:
        archive.add_endpoint(name, fn.python_function, input_signature=signature)
    archive.write_out(path, verbose=False)
    # the graph holds the SentencePiece model itself; the file is for people and tools
    os.makedirs(os.path.join(path, "assets"), exist_ok=True)
    with open(os.path.join(path, "assets", "spm.model"), "wb") as handle:
        handle.write(translator.tokenizer.proto)
    write_options(os.path.join(path, "assets"), translator.options)  # kt-translate's defaults
    # with xla: every shape the search compiles for, before any request
    shapes = xla_warmup_shapes(translator, xla_max_batch) if translator.xla else []
    layout.write_warmup(path, model_name, shapes)


def xla_warmup_shapes(translator: Translator, max_batch: int) -> list[list[int]]:
    """The shapes an `xla` translator's searches compile for (`xla_search.warmup_shapes`):
    requests of at most `max_batch` sentences of any length, the export's beam size and
    greedy search (beam 1), no target prefix."""
    return xla_search.warmup_shapes(
        max_batch=max_batch,
        source_widths=xla_search.source_widths(translator.max_input_length),
        max_extra_length=translator.max_extra_length,
        beam_sizes=sorted({translator.beam_size, 1}),
        max_output_length=translator.max_output_length,
    )


class SavedModelExporter:
    """--format savedmodel: a SavedModel in TF Serving's layout (`serving_layout`), its
    warmup records and its models.config entry."""

    def __init__(self, args: ExportArgs):
        self.args = args

    def check(self) -> None:
        """Nothing beyond the flags' own checks."""

    def check_model(self, model) -> None:
        """Every model exports as a SavedModel."""

    def described(self) -> dict:
        return self.args.described()

    def export(self, translator: Translator, agreement) -> str:
        args = self.args
        return export_translator(
            translator, args.export_dir, model_name=args.model_name, version=args.version,
            agreement=agreement, xla_max_batch=args.xla_max_batch,
        )  # fmt: skip


def exporter(args: ExportArgs):
    """The exporter of `args.format`: one class per format (FORMATS)."""
    if args.format == "ctranslate2":  # imported for that format only
        from keras_transformer.inference.ctranslate2_export import CTranslate2Exporter

        return CTranslate2Exporter(args)
    return SavedModelExporter(args)


def export_run(
    model_dir: str | ExportArgs,
    export_dir: str | None = None,
    *,
    model_name: str = "transformer",
    version: int | None = None,
    beam_size: int = BEAM_SIZE,
    alpha: float = ALPHA,
    max_extra_length: int = MAX_EXTRA_LENGTH,
    min_length: int = MIN_LENGTH,
    average_last: int = AVERAGE_LAST,
    use_best: bool = False,
    attention_layer: int | None = None,
    ema: bool = True,
    stop_rule: str = STOP_RULE,
    finish_rule: str = FINISH_RULE,
    dtype: str = "float32",
    export_format: str = "savedmodel",
    quantization: str = "float32",
    agreement_sentences: int = 0,
    xla: bool = False,
    xla_max_batch: int = XLA_MAX_BATCH,
) -> str:
    """Load the run in `model_dir` (averaging the last K checkpoints) and export it; returns
    the version directory (`export_with`). `model_dir` may also be kt-export's flags whole,
    an `ExportArgs` (then alone). The keywords are ExportArgs' fields but three, named as
    before it: `use_best` (--best), `ema` (False: --no-ema), `export_format` (--format);
    `quantization` applies to --format ctranslate2 only, and `agreement_sentences` is 0
    unless given (kt-export's: 200)."""
    if isinstance(model_dir, ExportArgs):
        return export_with(model_dir)
    return export_with(ExportArgs(
        model_dir, export_dir, model_name=model_name, version=version, average_last=average_last,
        best=use_best, no_ema=not ema, beam_size=beam_size, alpha=alpha,
        max_extra_length=max_extra_length, min_length=min_length, stop_rule=stop_rule,
        finish_rule=finish_rule, attention_layer=attention_layer, dtype=dtype, format=export_format,
        quantization=quantization if export_format == "ctranslate2" else None,
        agreement_sentences=agreement_sentences, xla=xla, xla_max_batch=xla_max_batch,
    ))  # fmt: skip


def export_with(args: ExportArgs) -> str:
    """Load the run `args` names (averaging the last K checkpoints) and export it as
    `args.format` asks (`exporter`); returns the version directory.

    Checkpoints holding moving averages of the weights (--ema-decay) contribute those unless
    `no_ema`; best/ holds only the weights that were validated. `dtype`: the exported
    model's compute dtype (the variables stay float32; logits, log-probabilities and scores
    too). `agreement_sentences` N > 0 compares the export, as written, with the float32
    exact-rule translator on the run's first N validation sentences (see `agreement`); the
    report is written either way. `xla`: the beam searches compiled by XLA (`Translator`'s
    `xla`), with warmup requests for up to `xla_max_batch` sentences a request.
    `finish_rule`: the SavedModel's beam search's (`DecodingOptions`), stored in
    assets/decoding.json.
    """
    args.check()
    chosen = exporter(args)
    chosen.check()
    _check_run(args)
    model, tokenizer, _ = load_trained(
        args.model_dir, average_last=args.average_last, use_best=args.best, ema=not args.no_ema
    )
    chosen.check_model(model)
    settings = args.search_settings()
    translator = Translator(
        with_compute_dtype(model, args.dtype),
        tokenizer,
        stop_rule=args.stop_rule,
        xla=args.xla,
        finish_rule=args.finish_rule,
        **settings,
    )
    agreement = agree.AgreementReport(
        args.model_dir,
        args.agreement_sentences,
        reference=Translator(model, tokenizer, stop_rule="exact", **settings),
        described=chosen.described(),
        max_input_length=translator.max_input_length,
    )
    return chosen.export(translator, agreement)


def _check_run(args: ExportArgs) -> None:
    """Raise `ExportError` for flags the run cannot serve, before loading its weights."""
    if not (args.best and args.no_ema):
        return
    if getattr(Run(args.model_dir).read_run_config().training, "ema_decay", None):
        raise ExportError(
            f"--best --no-ema: {args.model_dir}/best holds only the averaged weights that were "
            "validated (the run used --ema-decay); drop --best to export raw weights"
        )


def with_compute_dtype(model, dtype: str):
    """`model` computing in `dtype` ("float32": itself; else a copy under Keras'
    mixed_<dtype> policy: float32 variables holding the same weights)."""
    if dtype == "float32":
        return model
    from keras_transformer.model import Transformer

    copy = Transformer(model.config, dtype=f"mixed_{dtype}")
    copy.build()
    copy.set_weights(model.get_weights())
    return copy


__all__ = [
    "AVERAGE_LAST",
    "DTYPES_EXPORT",
    "FORMATS",
    "XLA_MAX_BATCH",
    "ExportArgs",
    "ExportError",
    "SavedModelExporter",
    "describe_export",
    "export_run",
    "export_translator",
    "export_with",
    "exporter",
    "with_compute_dtype",
    "xla_warmup_shapes",
]
