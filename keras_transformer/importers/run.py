"""A `MarianCheckpoint` (importers/marian.py) -> a run directory that kt-export, kt-translate
(through an export), kt-evaluate, kt-score and `kt-train --init-from` use as a trained run.

Ids. This package's vocabulary reserves pad 0, unk 1, bos 2, eos 3; Marian's has `</s>` 0,
`<unk>` 1 and no pad or bos (its decoder starts from a zero vector). The run's ids are pad 0,
unk 1 (Marian's 1), bos 2, eos 3 (Marian's 0), then Marian's ids 2, 3, ... at 4, 5, ...: the
embedding gains two rows (zeros: pad's input is masked, bos's is replaced by the zero start)
whose output logit is their bias, RESERVED_LOGIT, so that their probability is nil (below
1e-40 of the best token's; the log-probabilities of the other tokens are Marian's to float32
precision) and the search never picks them.

The weights: Marian's separate Q, K and V projections are concatenated into the fused ones
(`qkv` for self-attention, `kv` for cross-attention, head-major as Marian splits them);
Marian's (in, out) kernels and (1, out) biases are ours as they are.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from keras_transformer.importers.marian import ImportFailure, MarianCheckpoint
from keras_transformer.run_dir import Run
from keras_transformer.settings.run_config import RunConfig

logger = logging.getLogger(__name__)

RESERVED_LOGIT = -100.0
IMPORT_CHECKPOINT = "ckpt"


def marian_ids(vocab_size: int) -> list[int | None]:
    """For each of the run's ids, Marian's id (None: pad and bos, which Marian has not)."""
    return [None, 1, None, 0] + list(range(2, vocab_size))


def run_vocabulary(vocab: list[str]) -> list[str]:
    """The run's pieces in id order (data.marian_tokenizer.RESERVED_PIECES for pad, bos)."""
    from keras_transformer.data.marian_tokenizer import RESERVED_PIECES

    return [
        RESERVED_PIECES[i] if m is None else vocab[m] for i, m in enumerate(marian_ids(len(vocab)))
    ]


def build_model(checkpoint: MarianCheckpoint):
    """The Keras Transformer with the checkpoint's weights; ImportFailure names a weight
    that is missing, has another shape, or is left over (an option this model lacks)."""
    from keras_transformer.model import Transformer

    config, weights = checkpoint.config, dict(checkpoint.weights)
    model = Transformer(config)
    model.build()
    used: set[str] = set()

    def take(name, shape=None):
        if name not in weights:
            raise ImportFailure(f"the model has no weight {name} (expected from its options)")
        value = np.asarray(weights[name], np.float32)
        if shape is not None:
            value = value.reshape(-1) if len(shape) == 1 and value.ndim == 2 else value
            if tuple(value.shape) != tuple(shape):
                raise ImportFailure(
                    f"weight {name} has shape {tuple(value.shape)}, the options say {tuple(shape)}"
                )
        used.add(name)
        return value

    d, v = config.d_model, len(checkpoint.vocab)
    wemb = take("Wemb", (v, d))
    bias = take("decoder_ff_logit_out_b", (v,))
    rows = marian_ids(v)
    table = np.zeros((config.vocab_size, d), np.float32)
    logits_bias = np.full((config.vocab_size,), RESERVED_LOGIT, np.float32)
    for ours, theirs in enumerate(rows):
        if theirs is not None:
            table[ours], logits_bias[ours] = wemb[theirs], bias[theirs]
    model.embedding.embeddings.assign(table)
    model.embedding.bias.assign(logits_bias)

    def norm(layer, scope):
        layer.gamma.assign(take(f"{scope}_ln_scale", (d,)))
        layer.beta.assign(take(f"{scope}_ln_bias", (d,)))

    def linear(scope, name, width):
        return take(f"{scope}_W{name}", (d, width)), take(f"{scope}_b{name}", (width,))

    def attention(block, scope, self_attention):
        mha = block.sublayer
        q, k, v_ = (linear(scope, n, d) for n in "qkv")
        if self_attention:
            mha.qkv_kernel.assign(np.concatenate([q[0], k[0], v_[0]], axis=1))
            mha.qkv_bias.assign(np.concatenate([q[1], k[1], v_[1]]))
        else:
            mha.q_kernel.assign(q[0])
            mha.q_bias.assign(q[1])
            mha.kv_kernel.assign(np.concatenate([k[0], v_[0]], axis=1))
            mha.kv_bias.assign(np.concatenate([k[1], v_[1]]))
        mha.output_kernel.assign(take(f"{scope}_Wo", (d, d)))
        mha.output_bias.assign(take(f"{scope}_bo", (d,)))
        norm(block.norm, f"{scope}_Wo")

    def feed_forward(block, scope):
        ffn = block.sublayer
        w1, b1 = linear(scope, "1", config.d_ff)
        ffn.inner_kernel.assign(w1)
        ffn.inner_bias.assign(b1)
        ffn.output_kernel.assign(take(f"{scope}_W2", (config.d_ff, d)))
        ffn.output_bias.assign(take(f"{scope}_b2", (d,)))
        norm(block.norm, f"{scope}_ffn")

    for i, layer in enumerate(model.encoder.blocks):
        attention(layer.self_attention, f"encoder_l{i + 1}_self", True)
        feed_forward(layer.feed_forward, f"encoder_l{i + 1}_ffn")
    for i, layer in enumerate(model.decoder.blocks):
        attention(layer.self_attention, f"decoder_l{i + 1}_self", True)
        attention(layer.cross_attention, f"decoder_l{i + 1}_context", False)
        feed_forward(layer.feed_forward, f"decoder_l{i + 1}_ffn")
    left = sorted(set(weights) - used)
    if left:
        shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
        raise ImportFailure(f"the model has weights this Transformer has no place for: {shown}")
    return model


def write_run(checkpoint: MarianCheckpoint, model_dir: str) -> Run:
    """Write the run directory: config.json, the tokenizer's files, the weights as
    checkpoints/ckpt-1 and best/ckpt-1 (what kt-export and kt-train --init-from read).

    Refuses a `model_dir` that already holds a run. Everything is checked (the model built,
    every weight placed, the tokenizer loaded) before the first file is written."""
    import tensorflow as tf

    from keras_transformer.data.marian_tokenizer import MarianTokenizer

    run = Run(model_dir)
    if run.exists or (os.path.isdir(model_dir) and os.listdir(model_dir)):
        raise ImportFailure(
            f"--model-dir {model_dir} is not empty: give a new directory for the imported run"
        )
    model = build_model(checkpoint)
    try:
        tokenizer = MarianTokenizer(
            checkpoint.source_spm, checkpoint.target_spm, run_vocabulary(checkpoint.vocab)
        )
    except (tf.errors.OpError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise ImportFailure(
            f"source.spm / target.spm is not a SentencePiece model ({first})"
        ) from None
    run.write_run_config(RunConfig.of_import(checkpoint.config, checkpoint.origin))
    run.save_tokenizer(tokenizer)
    saved = tf.train.Checkpoint(model=model)
    for best in (False, True):
        run.checkpoint_manager(saved, best=best).save(checkpoint_number=1)
    logger.info(
        "imported %s (%s) into %s: %d + %d layers, d_model %d, vocabulary %d",
        checkpoint.origin["source"],
        checkpoint.origin["format"],
        model_dir,
        checkpoint.config.num_layers,
        checkpoint.config.num_decoder_layers,
        checkpoint.config.d_model,
        checkpoint.config.vocab_size,
    )
    return run
