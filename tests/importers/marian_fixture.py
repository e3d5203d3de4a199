"""A small random OPUS-MT model written as Marian writes it, and the same weights in Hugging
Face's layout, with SentencePiece models trained on a few Multi30k lines.

The names, shapes and options are Marian's (`special:model.yml` included), as its converters
read them (CTranslate2's `converters/marian.py`, Hugging Face's `convert_marian_to_pytorch`):
weights (in, out), biases and norms (1, d), one shared `Wemb` (--tied-embeddings-all), the
output bias `decoder_ff_logit_out_b`, layers numbered from 1.
"""

from __future__ import annotations

import gzip
import io
import json
import os

import numpy as np
import yaml

LANGUAGE_TOKENS = (">>fra<<", ">>deu<<")
# a source piece left out of the vocabulary: the model maps it to <unk> (CTranslate2 too)
DROPPED = 3


def multi30k_lines(data_dir: str, side: str, count: int, split: str = "train") -> list[str]:
    with gzip.open(os.path.join(data_dir, f"{split}.{side}.gz"), "rt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(count)]


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, minloglevel=2, num_threads=1,
    )  # fmt: skip
    return model.getvalue()


def spm_pieces(proto: bytes) -> list[str]:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=proto)
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def options(d=32, heads=4, ff=64, enc=2, dec=3, activation="swish", vocab=0, **changes):
    """special:model.yml as Marian writes it for an OPUS-MT transformer."""
    return {
        "type": "transformer", "dim-vocabs": [vocab, vocab], "dim-emb": d,
        "enc-depth": enc, "dec-depth": dec, "transformer-heads": heads,
        "transformer-dim-ffn": ff, "transformer-ffn-depth": 2,
        "transformer-ffn-activation": activation, "transformer-preprocess": "",
        "transformer-postprocess": "dan", "transformer-postprocess-emb": "d",
        "transformer-postprocess-top": "", "transformer-decoder-autoreg": "self-attention",
        "transformer-no-projection": False, "transformer-tied-layers": [],
        "transformer-guided-alignment-layer": "last", "transformer-aan-depth": 2,
        "transformer-train-position-embeddings": False, "tied-embeddings": False,
        "tied-embeddings-src": False, "tied-embeddings-all": True, "right-left": False,
        "layer-normalization": False, "version": "v1.9.56 (tests)", **changes,
    }  # fmt: skip


def random_weights(opts: dict, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, ff = opts["dim-emb"], opts["transformer-dim-ffn"]

    def normal(*shape, scale=None):
        return rng.normal(0.0, scale or shape[0] ** -0.5, size=shape).astype(np.float32)

    weights = {"Wemb": normal(vocab, d, scale=0.3), "decoder_ff_logit_out_b": normal(1, vocab)}
    weights["decoder_ff_logit_out_b"][0, 0] += 6.0  # </s>: sentences end within ~20 steps

    def attention(scope):
        for m in "qkvo":
            weights[f"{scope}_W{m}"] = normal(d, d)
            weights[f"{scope}_b{m}"] = normal(1, d, scale=0.1)
        norm(f"{scope}_Wo")

    def norm(scope):
        weights[f"{scope}_ln_scale"] = 1.0 + normal(1, d, scale=0.1)
        weights[f"{scope}_ln_bias"] = normal(1, d, scale=0.1)

    def ffn(scope):
        weights[f"{scope}_W1"], weights[f"{scope}_b1"] = normal(d, ff), normal(1, ff, scale=0.1)
        weights[f"{scope}_W2"], weights[f"{scope}_b2"] = normal(ff, d), normal(1, d, scale=0.1)
        norm(f"{scope}_ffn")

    for i in range(1, opts["enc-depth"] + 1):
        attention(f"encoder_l{i}_self")
        ffn(f"encoder_l{i}_ffn")
    for i in range(1, opts["dec-depth"] + 1):
        attention(f"decoder_l{i}_self")
        attention(f"decoder_l{i}_context")
        ffn(f"decoder_l{i}_ffn")
    return weights


def write_vocab_yml(path: str, vocab: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, piece in enumerate(vocab):
            f.write(f"{json.dumps(piece, ensure_ascii=False)}: {i}\n")


def write_npz(path: str, weights: dict, opts: dict) -> None:
    text = yaml.safe_dump(opts, sort_keys=False).encode("utf-8") + b"\0"
    np.savez(path, **weights, **{"special:model.yml": np.frombuffer(text, np.int8)})


def make_marian_dir(path: str, data_dir: str, *, seed: int = 0, lines: int = 300, **opts):
    """Write a Marian model directory; returns (vocabulary, weights, options)."""
    os.makedirs(path, exist_ok=True)
    source_spm = train_spm(multi30k_lines(data_dir, "en", lines), 150)
    target_spm = train_spm(multi30k_lines(data_dir, "de", lines), 150)
    source_pieces = spm_pieces(source_spm)
    pieces = [p for p in source_pieces if p != source_pieces[-DROPPED]]
    pieces += [p for p in spm_pieces(target_spm) if p not in pieces]
    vocab = ["</s>", "<unk>", *LANGUAGE_TOKENS, *pieces]
    opts = options(vocab=len(vocab), **opts)
    weights = random_weights(opts, len(vocab), seed)
    for name, proto in (("source.spm", source_spm), ("target.spm", target_spm)):
        with open(os.path.join(path, name), "wb") as f:
            f.write(proto)
    write_vocab_yml(os.path.join(path, "opus.spm32k-spm32k.vocab.yml"), vocab)
    write_npz(
        os.path.join(path, "opus.spm32k-spm32k.transformer.model1.npz.best-perplexity.npz"),
        weights,
        opts,
    )
    with open(os.path.join(path, "decoder.yml"), "w", encoding="utf-8") as f:
        f.write(
            "models:\n  - opus.spm32k-spm32k.transformer.model1.npz.best-perplexity.npz\n"
            "vocabs:\n  - opus.spm32k-spm32k.vocab.yml\n  - opus.spm32k-spm32k.vocab.yml\n"
            "beam-size: 6\nnormalize: 0.6\nword-penalty: 0\nmini-batch: 1\nmaxi-batch: 1\n"
            "maxi-batch-sort: src\nrelative-paths: true\n"
        )
    return vocab, weights, opts


def write_huggingface_dir(path: str, marian_dir: str, vocab, weights, opts) -> None:
    """The same model as Hugging Face's conversion writes it (MarianMTModel's state dict in
    model.safetensors, `<pad>` appended as the last id)."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    pad = len(vocab)
    d = opts["dim-emb"]
    shared = np.concatenate([weights["Wemb"], np.zeros((1, d), np.float32)])
    tensors = {
        "model.shared.weight": shared,
        "model.encoder.embed_tokens.weight": shared,
        "model.decoder.embed_tokens.weight": shared,
        "lm_head.weight": shared,
        "final_logits_bias": np.concatenate(
            [weights["decoder_ff_logit_out_b"], np.zeros((1, 1), np.float32)], axis=1
        ),
    }
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}

    def attention(theirs, ours, norm_name):
        for m, h in names.items():
            tensors[f"{theirs}.{h}.weight"] = np.ascontiguousarray(weights[f"{ours}_W{m}"].T)
            tensors[f"{theirs}.{h}.bias"] = weights[f"{ours}_b{m}"][0]
        tensors[f"{norm_name}.weight"] = weights[f"{ours}_Wo_ln_scale"][0]
        tensors[f"{norm_name}.bias"] = weights[f"{ours}_Wo_ln_bias"][0]

    def ffn(theirs, ours):
        for k in "12":
            tensors[f"{theirs}.fc{k}.weight"] = np.ascontiguousarray(weights[f"{ours}_W{k}"].T)
            tensors[f"{theirs}.fc{k}.bias"] = weights[f"{ours}_b{k}"][0]
        tensors[f"{theirs}.final_layer_norm.weight"] = weights[f"{ours}_ffn_ln_scale"][0]
        tensors[f"{theirs}.final_layer_norm.bias"] = weights[f"{ours}_ffn_ln_bias"][0]

    for i in range(opts["enc-depth"]):
        t, m = f"model.encoder.layers.{i}", f"encoder_l{i + 1}"
        attention(f"{t}.self_attn", f"{m}_self", f"{t}.self_attn_layer_norm")
        ffn(t, f"{m}_ffn")
    for i in range(opts["dec-depth"]):
        t, m = f"model.decoder.layers.{i}", f"decoder_l{i + 1}"
        attention(f"{t}.self_attn", f"{m}_self", f"{t}.self_attn_layer_norm")
        attention(f"{t}.encoder_attn", f"{m}_context", f"{t}.encoder_attn_layer_norm")
        ffn(t, f"{m}_ffn")
    save_file(tensors, os.path.join(path, "model.safetensors"))
    activation = {"swish": "swish", "relu": "relu"}[opts["transformer-ffn-activation"]]
    config = {
        "model_type": "marian", "architectures": ["MarianMTModel"], "d_model": d,
        "encoder_layers": opts["enc-depth"], "decoder_layers": opts["dec-depth"],
        "encoder_attention_heads": opts["transformer-heads"],
        "decoder_attention_heads": opts["transformer-heads"],
        "encoder_ffn_dim": opts["transformer-dim-ffn"],
        "decoder_ffn_dim": opts["transformer-dim-ffn"], "activation_function": activation,
        "vocab_size": pad + 1, "pad_token_id": pad, "eos_token_id": 0,
        "decoder_start_token_id": pad, "max_position_embeddings": 512, "scale_embedding": True,
        "normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
        "static_position_embeddings": True, "share_encoder_decoder_embeddings": True,
    }  # fmt: skip
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(path, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({**{p: i for i, p in enumerate(vocab)}, "<pad>": pad}, f, ensure_ascii=False)
    for name in ("source.spm", "target.spm"):
        with (
            open(os.path.join(marian_dir, name), "rb") as src,
            open(os.path.join(path, name), "wb") as dst,
        ):
            dst.write(src.read())
