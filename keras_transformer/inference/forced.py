"""Forced decoding: the model's scores of given targets in one pass, no search (`score`)."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import BOS_ID, EOS_ID


def forced_scores(model, source, target_ids, attention_layer: int):
    """(B, S) source ids and ragged target ids (without bos/eos) -> {"scores" (B,) the sum
    of the target tokens' log-probabilities, eos included; "token_scores" (B, T) float32, 0
    after eos; "target_out" (B, T) the target ids, eos last, 0 padding; "attention" (B, T, S)
    float32, the cross-attention of decoder layer `attention_layer` averaged over its heads,
    0 on padding}."""
    batch = tf.shape(source)[0]
    target_out = tf.concat([target_ids, tf.fill([batch, 1], EOS_ID)], axis=1).to_tensor()
    target_in = tf.concat([tf.fill([batch, 1], BOS_ID), target_ids], axis=1).to_tensor()
    logits, cross = model.forced_decode(source, target_in)
    log_probs = tf.nn.log_softmax(logits)
    real = target_out > 0
    token_scores = tf.where(real, tf.gather(log_probs, target_out, batch_dims=2), 0.0)
    attention = tf.reduce_mean(tf.cast(cross[attention_layer], tf.float32), axis=1)
    pad = tf.logical_and(real[:, :, tf.newaxis], (source > 0)[:, tf.newaxis, :])
    return {
        "scores": tf.reduce_sum(token_scores, axis=1),
        "token_scores": token_scores,
        "target_out": target_out,
        "attention": tf.where(pad, attention, 0.0),
    }
