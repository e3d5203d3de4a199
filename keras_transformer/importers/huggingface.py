"""A Hugging Face Marian directory (`Helsinki-NLP/opus-mt-*`): `config.json`,
`model.safetensors` (read with the `safetensors` package into numpy, no PyTorch),
`vocab.json`, `source.spm` and `target.spm`. Its weights are renamed to Marian's
(`marian_names`), so both layouts give the same `MarianCheckpoint`.
"""

from __future__ import annotations

import json
import os

import numpy as np

from keras_transformer.importers.checkpoint import (
    HF_FORMAT,
    ImportFailure,
    MarianCheckpoint,
    model_config,
    read_spm,
    source_file,
)

HF_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# config.json keys that must have these values (when present)
HF_REQUIRED = {
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "scale_embedding": True,
    "share_encoder_decoder_embeddings": True,
    "static_position_embeddings": True,
}
PROJECTIONS = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}


def read_config_json(path: str) -> dict:
    """config.json, checked: a Marian model whose options this Transformer has."""
    try:
        with open(path, encoding="utf-8") as handle:
            hf = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ImportFailure(f"{path} is not valid JSON ({err})") from None
    if hf.get("model_type") != "marian":
        raise ImportFailure(
            f"{path}: model_type {hf.get('model_type')!r} is not supported (only 'marian')"
        )
    for key, allowed in HF_REQUIRED.items():
        if key in hf and hf[key] != allowed:
            raise ImportFailure(f"{path}: {key} {hf[key]!r} is not supported")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(enc) != hf.get(dec):
            raise ImportFailure(f"{path}: {enc} and {dec} differ, which is not supported")
    activation = hf.get("activation_function", "swish")
    if activation not in HF_ACTIVATIONS:
        raise ImportFailure(
            f"{path}: activation_function {activation!r} is not supported "
            f"(only {', '.join(HF_ACTIVATIONS)})"
        )
    return hf


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ImportFailure(
            "reading model.safetensors needs the safetensors package: pip install safetensors"
        ) from None
    try:
        return load_file(path)
    except Exception as err:  # safetensors raises its own error types
        raise ImportFailure(f"{path} is not a readable safetensors file ({err})") from None


def read_huggingface(source_dir: str) -> MarianCheckpoint:
    config_path = source_file(source_dir, "config.json", "a Hugging Face model directory has one")
    hf = read_config_json(config_path)
    tensors_path = source_file(
        source_dir, "model.safetensors", "the weights (read without PyTorch)"
    )
    tensors = read_safetensors(tensors_path)
    pad = hf.get("pad_token_id")
    shared = tensors.get("model.shared.weight")
    if shared is None:
        raise ImportFailure(f"{tensors_path} has no model.shared.weight (the shared embedding)")
    if pad != shared.shape[0] - 1:
        raise ImportFailure(
            f"{config_path}: pad_token_id {pad!r} is not the last row of the embedding "
            f"({shared.shape[0] - 1}), as OPUS-MT's conversion writes it"
        )
    vocab = read_vocab_json(source_file(source_dir, "vocab.json", "the shared vocabulary"))
    if vocab[pad:] != ["<pad>"]:
        raise ImportFailure(f"{source_dir}/vocab.json: id {pad} (pad_token_id) must be <pad>")
    config = model_config(
        vocab=pad,
        d_model=hf.get("d_model", shared.shape[1]),
        d_ff=hf.get("encoder_ffn_dim", 2048),
        heads=hf.get("encoder_attention_heads", 8),
        encoder_layers=hf.get("encoder_layers", 6),
        decoder_layers=hf.get("decoder_layers", 6),
        activation=HF_ACTIVATIONS[hf.get("activation_function", "swish")],
        where=config_path,
    )
    weights = marian_names(tensors, hf, tensors_path)
    source_spm, target_spm = read_spm(source_dir)
    origin = {"format": HF_FORMAT, "source": os.path.abspath(source_dir)}
    return MarianCheckpoint(config, weights, vocab[:pad], source_spm, target_spm, origin)


def read_vocab_json(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            mapping = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ImportFailure(f"{path} is not valid JSON ({err})") from None
    if not isinstance(mapping, dict) or sorted(mapping.values()) != list(range(len(mapping))):
        raise ImportFailure(f"{path} must map each piece to one id, 0 ... N-1 each once")
    return [piece for piece, _ in sorted(mapping.items(), key=lambda item: item[1])]


def marian_names(tensors: dict, hf: dict, where: str) -> dict[str, np.ndarray]:
    """Hugging Face's Marian state dict -> Marian's names, shapes and dtypes (float32):
    Linear weights (out, in) transposed to Marian's (in, out), biases and norms (1, d)."""
    pad = hf["pad_token_id"]

    def get(name):
        if name not in tensors:
            raise ImportFailure(f"{where} has no {name}")
        return np.asarray(tensors[name], np.float32)

    out = {
        "Wemb": get("model.shared.weight")[:pad],
        "decoder_ff_logit_out_b": get("final_logits_bias")[:, :pad].reshape(1, -1),
    }

    def attention(ours, theirs):
        for m, h in PROJECTIONS.items():
            out[f"{ours}_W{m}"] = get(f"{theirs}.{h}.weight").T
            out[f"{ours}_b{m}"] = get(f"{theirs}.{h}.bias")[None, :]

    def norm(ours, theirs):
        out[f"{ours}_ln_scale"] = get(f"{theirs}.weight")[None, :]
        out[f"{ours}_ln_bias"] = get(f"{theirs}.bias")[None, :]

    def ffn(ours, theirs):
        for k in ("1", "2"):
            out[f"{ours}_W{k}"] = get(f"{theirs}.fc{k}.weight").T
            out[f"{ours}_b{k}"] = get(f"{theirs}.fc{k}.bias")[None, :]
        norm(f"{ours}_ffn", f"{theirs}.final_layer_norm")

    for i in range(hf.get("encoder_layers", 6)):
        ours, theirs = f"encoder_l{i + 1}", f"model.encoder.layers.{i}"
        attention(f"{ours}_self", f"{theirs}.self_attn")
        norm(f"{ours}_self_Wo", f"{theirs}.self_attn_layer_norm")
        ffn(f"{ours}_ffn", theirs)
    for i in range(hf.get("decoder_layers", 6)):
        ours, theirs = f"decoder_l{i + 1}", f"model.decoder.layers.{i}"
        attention(f"{ours}_self", f"{theirs}.self_attn")
        norm(f"{ours}_self_Wo", f"{theirs}.self_attn_layer_norm")
        attention(f"{ours}_context", f"{theirs}.encoder_attn")
        norm(f"{ours}_context_Wo", f"{theirs}.encoder_attn_layer_norm")
        ffn(f"{ours}_ffn", theirs)
    return out


__all__ = ["HF_ACTIVATIONS", "marian_names", "read_huggingface", "read_vocab_json"]
