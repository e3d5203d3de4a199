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
import shutil
import tempfile

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.config import (
    ALPHA,
    AVERAGE_LAST,
    BEAM_SIZE,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
    STOP_RULE,
)
from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import make_public_dir, write_atomic
from keras_transformer.inference import agreement as agree
from keras_transformer.inference import xla_search
from keras_transformer.inference.agreement import skipped, write_report
from keras_transformer.inference.options import (
    DTYPES,
    OPTIONS,
    SAMPLE,
    SCORE,
    STOP_RULE_OPTIONS,
    STRINGS,
    XLA_SHAPES,
)
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import Run, load_trained
from keras_transformer.settings.decoding import write_options

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_SENTENCES = ("A man is riding a bicycle.", "", "Zwei Hunde spielen im Schnee.")
# one warmup request per signature TF Serving may be asked (each traced and run once at load,
# so no client request pays for the first run): its inputs beside WARMUP_SENTENCES
_SEARCH_WARMUP = {
    "beam_size": [BEAM_SIZE, 1, 2],
    "alpha": [ALPHA, 0.0, 1.0],
    "max_extra_length": [MAX_EXTRA_LENGTH, 10, 5],
    "num_hypotheses": [1, 1, 2],
    "target_prefix": ["", "", "Two"],
}
WARMUP_OPTIONS = {
    "serving_default": {},
    "translate_nbest": {},
    "translate_with_options": _SEARCH_WARMUP,
    "translate_with_stop_rule": {**_SEARCH_WARMUP, "stop_rule": ["", "finished", "top"]},
    "score": {"targets": ["Ein Mann fährt Fahrrad.", "", "Two dogs play in the snow."]},
    "sample": {
        "temperature": [1.0, 0.7, 1.0],
        "top_k": [0, 5, 1],
        "top_p": [1.0, 0.9, 1.0],
        "seed": [0, 1, 2],
    },
}
MODELS_CONFIG = "models.config"
# --xla: the largest request (sentences) the warmup compiles for: serving/batching.config's
# max_batch_size; the rows of one warmup request (at most that too)
XLA_MAX_BATCH = 64
XLA_WARMUP_CHUNK = 32


class ExportError(KerasTransformerError, ValueError):
    """A bad export request; the message names the path or flag."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def warmup_record(
    model_name: str, sentences, signature_name: str = "serving_default", options=None
) -> bytes:
    """A serialized tensorflow.serving.PredictionLog holding one PredictRequest: `sentences`
    as "inputs" and `options` ({input name: one value per sentence}, dtypes from
    `options.DTYPES`; "targets" strings) as the signature's other inputs; `sentences` None:
    no "inputs" (`xla_warmup`, whose only input is "shapes").

    Encoded by hand (PredictionLog.predict_log = 6, PredictLog.request = 1,
    PredictRequest.model_spec = 1 / inputs = 2, ModelSpec.name = 1 / signature_name = 3)
    so that exporting needs no tensorflow-serving-api; tests check it against that package.
    """
    model_spec = _field(1, model_name.encode()) + _field(3, signature_name.encode())
    request = _field(1, model_spec)
    inputs = {} if sentences is None else {"inputs": list(sentences)}
    for name, values in {**inputs, **(options or {})}.items():
        dtype = DTYPES.get(name, tf.string)
        values = values if isinstance(values, np.ndarray) else list(values)  # shapes: (N, 5)
        tensor = tf.make_tensor_proto(values, dtype=dtype).SerializeToString()
        request += _field(2, _field(1, name.encode()) + _field(2, tensor))  # a map entry
    return _field(6, _field(1, request))


def warmup_records(model_name: str, xla_shapes=()) -> list[bytes]:
    """The warmup requests of an export: with `xla_shapes` (rows [P, C, S, K, W], see
    `xla_warmup_shapes`), first `xla_warmup` requests compiling them all, XLA_WARMUP_CHUNK
    rows a request; then one request per signature (WARMUP_OPTIONS)."""
    records = [
        warmup_record(
            model_name,
            None,
            "xla_warmup",
            {"shapes": np.array(xla_shapes[start : start + XLA_WARMUP_CHUNK], np.int32)},
        )
        for start in range(0, len(xla_shapes), XLA_WARMUP_CHUNK)
    ]
    return records + [
        warmup_record(model_name, WARMUP_SENTENCES, signature, options)
        for signature, options in WARMUP_OPTIONS.items()
    ]


def models_config(model_name: str, base_path: str, existing: str | None = None, path=""):
    """TF Serving's --model_config_file text: `existing`'s entries (parsed with protobuf
    text_format into tensorflow_serving's ModelServerConfig) with this model's entry replaced,
    or added last; the others kept with all their fields, in order."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    if existing:
        try:
            text_format.Parse(existing, config)
        except text_format.ParseError as err:
            raise ExportError(
                f"{path} is not a TF Serving model config ({err}); fix or move it away"
            ) from None
        if config.WhichOneof("config") == "custom_model_config":
            raise ExportError(
                f"{path} holds a custom_model_config, not a model_config_list; move it away"
            )
    entries = config.model_config_list.config
    mine = next((entry for entry in entries if entry.name == model_name), None)
    if mine is None:
        mine = entries.add()
    mine.Clear()
    mine.name, mine.base_path, mine.model_platform = model_name, base_path, "tensorflow"
    return text_format.MessageToString(config)


def write_models_config(export_dir: str, model_name: str, base_path: str) -> str:
    """Merge this model into `<export_dir>/models.config` (written atomically); its path."""
    path = os.path.join(export_dir, MODELS_CONFIG)
    existing = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            existing = handle.read()
    text = models_config(model_name, base_path, existing, path)
    write_atomic(path, text)
    return path


def next_version(model_root: str) -> int:
    versions = (
        [int(d) for d in os.listdir(model_root) if d.isdigit()] if os.path.isdir(model_root) else []
    )
    return max(versions, default=0) + 1


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

    The version directory appears whole or not at all (written beside it, then renamed);
    an existing version is never overwritten. `agreement(staging path)` -> the agreement
    report (dict, see `agreement`), written as assets.extra/agreement.json before the
    rename; default: a report saying none was made. `write(translator, staging path)`
    replaces the SavedModel writer (`--format ctranslate2`; models.config is then left as
    it is). A `Translator(xla=True)` gets warmup requests that compile its search for
    requests of up to `xla_max_batch` sentences.
    """
    model_root = os.path.join(export_dir, model_name)
    version = next_version(model_root) if version is None else version
    if not isinstance(version, int) or version < 1:
        raise ExportError(f"version must be a positive integer, got {version!r}")
    final = os.path.join(model_root, str(version))
    if os.path.exists(final):
        raise ExportError(f"{final} already exists; choose another version or leave it out")
    os.makedirs(model_root, exist_ok=True)
    # a private directory beside the final one (same filesystem, so the rename is atomic);
    # a concurrent export gets its own
    staging = tempfile.mkdtemp(dir=model_root, prefix=f".tmp-{version}-")
    try:
        make_public_dir(staging)  # mkdtemp's 0700 -> the umask's: TF Serving may be another user
        if write is None:
            _write_saved_model(translator, staging, model_name, xla_max_batch)
        else:
            write(translator, staging)
        report = agreement(staging) if agreement else skipped("no validation sentences given")
        write_report(os.path.join(staging, "assets.extra"), report)
        try:
            os.rename(staging, final)  # fails, rather than replaces, if `final` appeared
        except OSError:
            if os.path.exists(final):
                raise ExportError(
                    f"{final} was written meanwhile; choose another version"
                ) from None
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
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
    extra = os.path.join(path, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, WARMUP_FILE)) as writer:
        # with xla: every shape the search compiles for, before any request
        shapes = xla_warmup_shapes(translator, xla_max_batch) if translator.xla else []
        for record in warmup_records(model_name, shapes):
            writer.write(record)


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


def export_run(
    model_dir: str,
    export_dir: str,
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
    dtype: str = "float32",
    export_format: str = "savedmodel",
    quantization: str = "float32",
    agreement_sentences: int = 0,
    xla: bool = False,
    xla_max_batch: int = XLA_MAX_BATCH,
) -> str:
    """Load the run in `model_dir` (averaging the last K checkpoints) and export it.

    Checkpoints holding moving averages of the weights (--ema-decay) contribute those, unless
    `ema` is False (the raw weights). best/ holds only the weights that were validated.
    `dtype`: the exported model's compute dtype (DTYPES_EXPORT: the variables stay float32,
    each layer computes in it; logits, log-probabilities and scores stay float32).
    `export_format` "ctranslate2" writes a CTranslate2 model (weights in `quantization`)
    instead of a SavedModel. `agreement_sentences`: N > 0 compares the export, as written,
    with the float32 exact-rule translator on the run's first N validation sentences (see
    `agreement`); the report is written either way. `xla`: the beam searches compiled by
    XLA (`Translator`'s `xla`; SavedModel only), with warmup requests for up to
    `xla_max_batch` sentences a request; the agreement report then compares that export
    with the reference (the default export's search).
    """
    _check_options(model_dir, dtype, export_format, xla, use_best, ema)
    model, tokenizer, _ = load_trained(
        model_dir, average_last=average_last, use_best=use_best, ema=ema
    )
    if export_format == "ctranslate2" and model.config.positional != "sinusoidal":
        raise ExportError(
            f"--format ctranslate2 converts sinusoidal positions only; {model_dir} uses "
            f"{model.config.positional} ones: export it as a SavedModel"
        )
    settings = dict(
        beam_size=beam_size,
        alpha=alpha,
        max_extra_length=max_extra_length,
        min_length=min_length,
        attention_layer=attention_layer,
    )
    translator = Translator(
        with_compute_dtype(model, dtype), tokenizer, stop_rule=stop_rule, xla=xla, **settings
    )
    described = {"format": export_format, "dtype": dtype, "stop_rule": stop_rule, **settings}
    if xla:
        described["xla"] = True
    write = None
    if export_format == "ctranslate2":
        from keras_transformer.inference import ctranslate2_export

        def write(translator, path):
            ctranslate2_export.export_ctranslate2(model, tokenizer, path, quantization)

        # CTranslate2's own search: its rule with a length penalty, its penalty
        described.update(quantization=quantization, dtype=None, stop_rule="finished")
    agreement = agree.AgreementReport(
        model_dir,
        agreement_sentences,
        reference=Translator(model, tokenizer, stop_rule="exact", **settings),
        described=described,
        max_input_length=translator.max_input_length,
    )
    return export_translator(
        translator, export_dir, model_name=model_name, version=version, agreement=agreement,
        write=write, xla_max_batch=xla_max_batch,
    )  # fmt: skip


def _check_options(model_dir, dtype, export_format, xla, use_best, ema) -> None:
    """Raise `ExportError` for options that cannot go together, before loading anything."""
    if dtype not in DTYPES_EXPORT:
        raise ExportError(f"--dtype must be one of {', '.join(DTYPES_EXPORT)}, got {dtype!r}")
    if export_format not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {export_format!r}")
    check_search_format(xla, export_format)
    if use_best and not ema and Run(model_dir).training_settings().get("ema_decay"):
        raise ExportError(
            f"--best --no-ema: {model_dir}/best holds only the averaged weights that were "
            "validated (the run used --ema-decay); drop --best to export raw weights"
        )


def check_search_format(xla: bool, export_format: str) -> None:
    """Raise `ExportError` if `xla` is asked of a format that runs its own search."""
    if xla and export_format != "savedmodel":
        raise ExportError(
            f"--xla compiles a SavedModel's search; --format {export_format} runs its own: "
            "drop --xla or --format"
        )


DTYPES_EXPORT = ("float32", "bfloat16", "float16")
FORMATS = ("savedmodel", "ctranslate2")


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
