"""TensorFlow Serving's layout of an export directory, written with its own messages.

    <export_dir>/models.config                      every model exported there
    <export_dir>/<model_name>/<version>/            one directory per version, whole or absent
    <version>/assets.extra/tf_serving_warmup_requests

`models.config` is a `ModelServerConfig` (tensorflow_serving.config) in protobuf text format:
exporting a model replaces its own entry and keeps the others. The warmup file is a TFRecord
file of `PredictionLog`s (tensorflow_serving.apis), one request per signature TF Serving may
be asked (an XLA export: first the `xla_warmup` requests compiling its shapes), replayed by
the server at load (`--enable_model_warmup`) so that no client request pays for a first run.
`describe_export` says what a version directory holds (kt-export prints it).
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from keras_transformer.config import ALPHA, BEAM_SIZE, MAX_EXTRA_LENGTH
from keras_transformer.files import make_public_dir, write_atomic
from keras_transformer.inference.options import DTYPES
from keras_transformer.settings.export_args import ExportError

MODELS_CONFIG = "models.config"
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
# --xla: the rows [P, C, S, K, W] of one `xla_warmup` request
XLA_WARMUP_CHUNK = 32


def warmup_record(
    model_name: str, sentences, signature_name: str = "serving_default", options=None
) -> bytes:
    """A serialized tensorflow.serving.PredictionLog holding one PredictRequest: `sentences`
    as "inputs" and `options` ({input name: one value per sentence}, dtypes from
    `options.DTYPES`; "targets" strings) as the signature's other inputs; `sentences` None:
    no "inputs" (`xla_warmup`, whose only input is "shapes")."""
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    request = predict_pb2.PredictRequest(
        model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature_name)
    )
    inputs = {} if sentences is None else {"inputs": list(sentences)}
    for name, values in {**inputs, **(options or {})}.items():
        values = values if isinstance(values, np.ndarray) else list(values)  # shapes: (N, 5)
        tensor = tf.make_tensor_proto(values, dtype=DTYPES.get(name, tf.string))
        request.inputs[name].CopyFrom(tensor)
    log = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)
    )
    return log.SerializeToString()


def warmup_records(model_name: str, xla_shapes=()) -> list[bytes]:
    """The warmup requests of an export: with `xla_shapes` (rows [P, C, S, K, W], see
    `export.xla_warmup_shapes`), first `xla_warmup` requests compiling them all,
    XLA_WARMUP_CHUNK rows a request; then one request per signature (WARMUP_OPTIONS)."""
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


def write_warmup(version_dir: str, model_name: str, xla_shapes=()) -> str:
    """Write `warmup_records` as `<version_dir>/assets.extra/tf_serving_warmup_requests`."""
    extra = os.path.join(version_dir, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    path = os.path.join(extra, WARMUP_FILE)
    with tf.io.TFRecordWriter(path) as writer:
        for record in warmup_records(model_name, xla_shapes):
            writer.write(record)
    return path


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


def write_version(model_root: str, version: int | None, fill) -> str:
    """`<model_root>/<version>/` (default: the next free version) filled by `fill(path)`;
    returns it. The directory appears whole or not at all (written beside it, then renamed);
    an existing version is never overwritten."""
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
        fill(staging)
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
    return final


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
