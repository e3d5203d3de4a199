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
`models.config` lists every model exported to the same directory: exporting a model
replaces its own entry and keeps the others. The warmup file holds one request per
signature; agreement.json compares the export with the reference search (`agreement`).
"""

from __future__ import annotations

import os

import keras
import tensorflow as tf

from keras_transformer.config import AVERAGE_LAST
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
from keras_transformer.inference.serving_layout import (
    MODELS_CONFIG,
    WARMUP_FILE,
    WARMUP_OPTIONS,
    WARMUP_SENTENCES,
    XLA_WARMUP_CHUNK,
    models_config,
    next_version,
    warmup_record,
    warmup_records,
    write_models_config,
)
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import Run, load_trained
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


def describe_export(path: str) -> str:
    """What an export holds: its files' size on disk and each signature's inputs/outputs."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )
    lines = [f"{path}: {size / 2**20:.1f} MiB on disk"]
    for sub in ("saved_model.pb", "variables", "assets", "assets.extra"):
        lines.append(f"  {os.path.join(path, sub)}")

    def describe(tensors):
        parts = []
        for key, info in sorted(tensors.items()):
            dims = [d.size if d.size >= 0 else None for d in info.tensor_shape.dim]
            parts.append(f"{key} {tf.dtypes.as_dtype(info.dtype).name}{dims}")
        return ", ".join(parts)

    signatures = saved.meta_graphs[0].signature_def
    for name in sorted(s for s in signatures if not s.startswith("__")):
        sig = signatures[name]
        lines.append(f"  signature {name}: ({describe(sig.inputs)}) -> ({describe(sig.outputs)})")
    return "\n".join(lines)


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


def export_run(args: ExportArgs | str, export_dir: str | None = None, **flags) -> str:
    """Load the run that `args` names (averaging the last K checkpoints) and export it as
    `args.format` asks; returns the version directory.

    `args`: kt-export's flags (`ExportArgs`), or a run directory, with `export_dir` and
    `flags` (ExportArgs' field names) making one; called so, `agreement_sentences`
    defaults to 0 (kt-export: 200). Checkpoints holding moving averages of the weights
    (--ema-decay) contribute those unless `no_ema`; best/ holds only the weights that were
    validated. `dtype`: the exported model's compute dtype (the variables stay float32;
    logits, log-probabilities and scores too). `agreement_sentences` N > 0 compares the
    export, as written, with the float32 exact-rule translator on the run's first N
    validation sentences (see `agreement`); the report is written either way. `xla`: the
    beam searches compiled by XLA (`Translator`'s `xla`), with warmup requests for up to
    `xla_max_batch` sentences a request.
    """
    if not isinstance(args, ExportArgs):
        args = ExportArgs(args, export_dir, **{"agreement_sentences": 0, **flags})
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
    if args.best and args.no_ema and Run(args.model_dir).training_settings().get("ema_decay"):
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
    "MODELS_CONFIG",
    "WARMUP_FILE",
    "WARMUP_OPTIONS",
    "WARMUP_SENTENCES",
    "XLA_MAX_BATCH",
    "XLA_WARMUP_CHUNK",
    "ExportArgs",
    "ExportError",
    "SavedModelExporter",
    "describe_export",
    "export_run",
    "export_translator",
    "exporter",
    "models_config",
    "next_version",
    "warmup_record",
    "warmup_records",
    "with_compute_dtype",
    "xla_warmup_shapes",
]
