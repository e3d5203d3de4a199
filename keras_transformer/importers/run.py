"""A `MarianCheckpoint` (importers/checkpoint.py) -> a run directory that kt-export, kt-translate
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

from keras_transformer.importers.checkpoint import ImportFailure, MarianCheckpoint
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


class Weights:
    """The checkpoint's weights by Marian's name, handed out once each and checked."""

    def __init__(self, weights: dict):
        self.weights, self.used = dict(weights), set()

    def take(self, name: str, shape) -> np.ndarray:
        """The weight `name` as float32 of `shape` ((1, n) read as (n,)); ImportFailure when
        it is missing or has another shape."""
        if name not in self.weights:
            raise ImportFailure(f"the model has no weight {name} (expected from its options)")
        value = np.asarray(self.weights[name], np.float32)
        value = value.reshape(-1) if len(shape) == 1 and value.ndim == 2 else value
        if tuple(value.shape) != tuple(shape):
            raise ImportFailure(
                f"weight {name} has shape {tuple(value.shape)}, the options say {tuple(shape)}"
            )
        self.used.add(name)
        return value

    def check_all_used(self) -> None:
        left = sorted(set(self.weights) - self.used)
        if left:
            shown = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            raise ImportFailure(f"the model has weights this Transformer has no place for: {shown}")


def place_embedding(embedding, weights: Weights, vocab_size: int, d: int) -> None:
    """Marian's Wemb and output bias in the run's id order (`marian_ids`); the rows Marian has
    not (pad, bos) are zeros with the output bias RESERVED_LOGIT."""
    rows = marian_ids(vocab_size - 2)
    wemb = weights.take("Wemb", (len(rows) - 2, d))
    bias = weights.take("decoder_ff_logit_out_b", (len(rows) - 2,))
    table = np.zeros((vocab_size, d), np.float32)
    logits_bias = np.full((vocab_size,), RESERVED_LOGIT, np.float32)
    for ours, theirs in enumerate(rows):
        if theirs is not None:
            table[ours], logits_bias[ours] = wemb[theirs], bias[theirs]
    embedding.embeddings.assign(table)
    embedding.bias.assign(logits_bias)


def place_norm(layer, weights: Weights, scope: str, d: int) -> None:
    layer.gamma.assign(weights.take(f"{scope}_ln_scale", (d,)))
    layer.beta.assign(weights.take(f"{scope}_ln_bias", (d,)))


def place_attention(block, weights: Weights, scope: str, d: int, self_attention: bool) -> None:
    """Marian's separate Q, K, V into the fused `qkv` (self-attention) or `kv` (cross)."""
    mha = block.sublayer
    q, k, v = ((weights.take(f"{scope}_W{n}", (d, d)), weights.take(f"{scope}_b{n}", (d,)))
               for n in "qkv")  # fmt: skip
    if self_attention:
        mha.qkv_kernel.assign(np.concatenate([q[0], k[0], v[0]], axis=1))
        mha.qkv_bias.assign(np.concatenate([q[1], k[1], v[1]]))
    else:
        mha.q_kernel.assign(q[0])
        mha.q_bias.assign(q[1])
        mha.kv_kernel.assign(np.concatenate([k[0], v[0]], axis=1))
        mha.kv_bias.assign(np.concatenate([k[1], v[1]]))
    mha.output_kernel.assign(weights.take(f"{scope}_Wo", (d, d)))
    mha.output_bias.assign(weights.take(f"{scope}_bo", (d,)))
    place_norm(block.norm, weights, f"{scope}_Wo", d)


def place_feed_forward(block, weights: Weights, scope: str, d: int, d_ff: int) -> None:
    ffn = block.sublayer
    ffn.inner_kernel.assign(weights.take(f"{scope}_W1", (d, d_ff)))
    ffn.inner_bias.assign(weights.take(f"{scope}_b1", (d_ff,)))
    ffn.output_kernel.assign(weights.take(f"{scope}_W2", (d_ff, d)))
    ffn.output_bias.assign(weights.take(f"{scope}_b2", (d,)))
    place_norm(block.norm, weights, f"{scope}_ffn", d)


def build_model(checkpoint: MarianCheckpoint):
    """The Keras Transformer with the checkpoint's weights; ImportFailure names a weight
    that is missing, has another shape, or is left over (an option this model lacks)."""
    from keras_transformer.model import Transformer

    config = checkpoint.config
    d, d_ff = config.d_model, config.d_ff
    model = Transformer(config)
    model.build()
    weights = Weights(checkpoint.weights)
    place_embedding(model.embedding, weights, config.vocab_size, d)
    for i, layer in enumerate(model.encoder.blocks):
        place_attention(layer.self_attention, weights, f"encoder_l{i + 1}_self", d, True)
        place_feed_forward(layer.feed_forward, weights, f"encoder_l{i + 1}_ffn", d, d_ff)
    for i, layer in enumerate(model.decoder.blocks):
        place_attention(layer.self_attention, weights, f"decoder_l{i + 1}_self", d, True)
        place_attention(layer.cross_attention, weights, f"decoder_l{i + 1}_context", d, False)
        place_feed_forward(layer.feed_forward, weights, f"decoder_l{i + 1}_ffn", d, d_ff)
    weights.check_all_used()
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
    run.create(RunConfig.of_import(checkpoint.config, checkpoint.origin), tokenizer)
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
