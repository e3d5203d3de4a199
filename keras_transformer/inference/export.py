"""SavedModel export in TensorFlow Serving's layout.

    <export_dir>/models.config
    <export_dir>/<model_name>/<version>/saved_model.pb
                                       variables/
                                       assets/spm.model
                                       assets.extra/tf_serving_warmup_requests

Signatures: `serving_default` (inputs: string (None,) -> outputs: string (None,), scores:
float32 (None,)), `translate_nbest` (outputs and scores of shape (None, beam)) and
`translate_with_options` (inputs plus scalar beam_size, alpha, max_extra_length,
num_hypotheses -> outputs and scores of shape (None, num_hypotheses)). The graph holds only
TensorFlow and TensorFlow Text ops. Variables are tracked through
`keras.export.ExportArchive`, so TF1-style session loaders (TF Serving's) find them.
`models.config` lists every model exported to the same directory: exporting a model
replaces its own entry and keeps the others.
"""

from __future__ import annotations

import os
import re
import shutil

import keras
import tensorflow as tf

from keras_transformer.config import ALPHA, AVERAGE_LAST, BEAM_SIZE, MAX_EXTRA_LENGTH
from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import write_atomic
from keras_transformer.inference.translator import OPTIONS, STRINGS, Translator
from keras_transformer.run_dir import load_trained

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_SENTENCES = ("A man is riding a bicycle.", "", "Zwei Hunde spielen im Schnee.")
MODELS_CONFIG = "models.config"


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


def warmup_record(model_name: str, sentences, signature_name: str = "serving_default") -> bytes:
    """A serialized tensorflow.serving.PredictionLog holding one PredictRequest.

    Encoded by hand (PredictionLog.predict_log = 6, PredictLog.request = 1,
    PredictRequest.model_spec = 1 / inputs = 2, ModelSpec.name = 1 / signature_name = 3)
    so that exporting needs no tensorflow-serving-api; tests check it against that package.
    """
    tensor = tf.make_tensor_proto(list(sentences), dtype=tf.string).SerializeToString()
    model_spec = _field(1, model_name.encode()) + _field(3, signature_name.encode())
    inputs_entry = _field(1, b"inputs") + _field(2, tensor)  # map<string, TensorProto> entry
    request = _field(1, model_spec) + _field(2, inputs_entry)
    return _field(6, _field(1, request))


def _config_entry(model_name: str, base_path: str) -> str:
    return (
        "\n"
        f'    name: "{model_name}"\n'
        f'    base_path: "{base_path}"\n'
        '    model_platform: "tensorflow"\n'
        "  "
    )


def _config_blocks(text: str, path: str) -> list[str]:
    """The bodies of the `config { ... }` entries of a model_config_list, verbatim."""
    start = text.find("model_config_list")
    opening = text.find("{", start)
    if start < 0 or opening < 0:
        raise ExportError(f"{path} is not a TF Serving model_config_list; move it away")
    blocks, depth, in_string, escaped, body_start = [], 0, False, False, None
    for i in range(opening + 1, len(text)):
        char = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == "{":
            depth += 1
            if depth == 1:
                body_start = i + 1
        elif char == "}":
            if depth == 0:
                return blocks
            depth -= 1
            if depth == 0:
                blocks.append(text[body_start:i])
    raise ExportError(f"{path}: unbalanced braces; fix or move it away")


def models_config(model_name: str, base_path: str, existing: str | None = None, path=""):
    """TF Serving's --model_config_file text: `existing`'s entries with this model's entry
    replaced (or added), the others kept verbatim and in order."""
    mine = _config_entry(model_name, base_path)
    blocks = _config_blocks(existing, path) if existing else []
    named = re.compile(r'^\s*name\s*:\s*"' + re.escape(model_name) + '"', re.MULTILINE)
    others = [block for block in blocks if not named.search(block)]
    at = next((i for i, block in enumerate(blocks) if named.search(block)), len(blocks))
    replaced = others[:at] + [mine] + others[at:]
    return "model_config_list {\n" + "".join(f"  config {{{b}}}\n" for b in replaced) + "}\n"


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
) -> str:
    """Write `translator` as `<export_dir>/<model_name>/<version>/`; returns that path.

    The version directory appears whole or not at all (written beside it, then renamed);
    an existing version is never overwritten.
    """
    model_root = os.path.join(export_dir, model_name)
    version = next_version(model_root) if version is None else version
    if not isinstance(version, int) or version < 1:
        raise ExportError(f"version must be a positive integer, got {version!r}")
    final = os.path.join(model_root, str(version))
    if os.path.exists(final):
        raise ExportError(f"{final} already exists; choose another version or leave it out")
    os.makedirs(model_root, exist_ok=True)
    staging = os.path.join(model_root, f".tmp-{version}")
    shutil.rmtree(staging, ignore_errors=True)

    archive = keras.export.ExportArchive()
    archive.track(translator.model)
    archive._tf_trackable.tokenizer = translator.tokenizer  # SentencePiece resource + asset
    archive.add_endpoint(
        "serving_default", translator.__call__.python_function, input_signature=[STRINGS]
    )
    archive.add_endpoint(
        "translate_nbest", translator.translate_nbest.python_function, input_signature=[STRINGS]
    )
    archive.add_endpoint(
        "translate_with_options",
        translator.translate_with_options.python_function,
        input_signature=OPTIONS,
    )
    archive.write_out(staging, verbose=False)

    extra = os.path.join(staging, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, WARMUP_FILE)) as writer:
        writer.write(warmup_record(model_name, WARMUP_SENTENCES))
    os.replace(staging, final)
    write_models_config(export_dir, model_name, base_path or f"/models/{model_name}")
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


def export_run(
    model_dir: str,
    export_dir: str,
    *,
    model_name: str = "transformer",
    version: int | None = None,
    beam_size: int = BEAM_SIZE,
    alpha: float = ALPHA,
    max_extra_length: int = MAX_EXTRA_LENGTH,
    average_last: int = AVERAGE_LAST,
    use_best: bool = False,
) -> str:
    """Load the run in `model_dir` (averaging the last K checkpoints) and export it."""
    model, tokenizer, _ = load_trained(model_dir, average_last=average_last, use_best=use_best)
    translator = Translator(
        model, tokenizer, beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
    )
    return export_translator(translator, export_dir, model_name=model_name, version=version)
