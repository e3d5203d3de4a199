"""SavedModel export in TensorFlow Serving's layout.

    <export_dir>/models.config
    <export_dir>/<model_name>/<version>/saved_model.pb
                                       variables/
                                       assets/spm.model
                                       assets.extra/tf_serving_warmup_requests

Signatures: `serving_default` (inputs: string (None,) -> outputs: string (None,), scores:
float32 (None,)) and `translate_nbest` (outputs and scores of shape (None, beam)). The graph
holds only TensorFlow and TensorFlow Text ops. Variables are tracked through
`keras.export.ExportArchive`, so TF1-style session loaders (TF Serving's) find them.
"""

from __future__ import annotations

import os
import shutil

import keras
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.run_dir import load_trained
from keras_transformer.translator import STRINGS, Translator

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_SENTENCES = ("A man is riding a bicycle.", "", "Zwei Hunde spielen im Schnee.")


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


def models_config(model_name: str, base_path: str) -> str:
    """TF Serving's --model_config_file text for one model."""
    return (
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{model_name}"\n'
        f'    base_path: "{base_path}"\n'
        '    model_platform: "tensorflow"\n'
        "  }\n"
        "}\n"
    )


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
        raise ExportError(f"--version must be a positive integer, got {version!r}")
    final = os.path.join(model_root, str(version))
    if os.path.exists(final):
        raise ExportError(f"{final} already exists; choose another --version or leave it out")
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
    archive.write_out(staging, verbose=False)

    extra = os.path.join(staging, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    with tf.io.TFRecordWriter(os.path.join(extra, WARMUP_FILE)) as writer:
        writer.write(warmup_record(model_name, WARMUP_SENTENCES))
    os.replace(staging, final)
    with open(os.path.join(export_dir, "models.config"), "w", encoding="utf-8") as handle:
        handle.write(models_config(model_name, base_path or f"/models/{model_name}"))
    return final


def export_run(
    model_dir: str,
    export_dir: str,
    *,
    model_name: str = "transformer",
    version: int | None = None,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_extra_length: int = 50,
    average_last: int = 1,
    use_best: bool = False,
) -> str:
    """Load the run in `model_dir` (averaging the last K checkpoints) and export it."""
    model, tokenizer, _ = load_trained(model_dir, average_last=average_last, use_best=use_best)
    translator = Translator(
        model, tokenizer, beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length
    )
    return export_translator(translator, export_dir, model_name=model_name, version=version)
