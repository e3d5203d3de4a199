"""The Translator's text side, in the graph: strings to source and target ids, ids to strings
and SentencePiece pieces. SentencePiece has CPU kernels only: its ops are pinned to the CPU
(`TOKENIZER_DEVICE`), so that an export also places on a GPU server (TF Serving #2016)."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import EOS_ID, RESERVED_IDS

TOKENIZER_DEVICE = "/device:CPU:0"


def clean(sentences):
    """(B,) strings with invalid UTF-8 bytes replaced by U+FFFD."""
    return tf.strings.unicode_transcode(
        sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )


def tokenize(tokenizer, strings, target=False):
    """(B,) strings -> ragged ids, without bos/eos, on the CPU; `target`: with the target
    side's SentencePiece model where the tokenizer has one (an imported OPUS-MT model,
    data/marian_tokenizer.py). `tokenizer`: a `SubwordTokenizer`."""
    tokenizer = tokenizer.tokenizer
    with tf.device(TOKENIZER_DEVICE):
        if target and hasattr(tokenizer, "tokenize_target"):
            return tokenizer.tokenize_target(strings)
        return tokenizer.tokenize(strings)


def pieces(tokenizer, ids):
    """(B, T) ids -> their SentencePiece pieces, "" for padding, on the CPU."""
    with tf.device(TOKENIZER_DEVICE):
        return tf.where(ids > 0, tokenizer.tokenizer.id_to_string(ids), "")


def encode_inputs(tokenizer, sentences, max_input_length: int):
    """(B,) strings -> (source ids (B, S) with eos, lengths (B,), empty (B,) bool,
    truncated (B,) bool: the input had more than `max_input_length` - 1 tokens)."""
    cleaned = clean(sentences)
    all_ids = tokenize(tokenizer, cleaned)
    truncated = all_ids.row_lengths() > max_input_length - 1
    ids = all_ids[:, : max_input_length - 1]
    eos = tf.fill([tf.shape(sentences)[0], 1], EOS_ID)
    source = tf.concat([ids, eos], axis=1)
    empty = tf.equal(tf.strings.length(tf.strings.strip(cleaned)), 0)
    return source.to_tensor(), source.row_lengths(), empty, truncated


def cut_targets(tokenizer, strings, max_output_length: int | None, room=1):
    """(B,) strings -> (ragged target ids, cut so that `room` more tokens fit
    `max_output_length` positions (None: no limit); (B,) bool: cut)."""
    ids = tokenize(tokenizer, clean(strings), target=True)
    if max_output_length is None:
        return ids, tf.zeros(tf.shape(strings)[:1], tf.bool)
    return ids[:, : max_output_length - room], ids.row_lengths() > (max_output_length - room)


def detokenize(tokenizer, ids, empty):
    """(B, K, L) ids -> (B, K) strings; "" where the input was empty."""
    shape = tf.shape(ids)
    flat = tf.reshape(ids, [-1, shape[2]])
    before_eos = tf.math.cumsum(tf.cast(tf.equal(flat, EOS_ID), tf.int32), axis=1) == 0
    lengths = tf.reduce_sum(tf.cast(before_eos, tf.int32), 1)
    ragged = tf.RaggedTensor.from_tensor(flat, lengths=lengths)
    with tf.device(TOKENIZER_DEVICE):  # pad, unk, bos and eos are not text
        ragged = tf.ragged.boolean_mask(ragged, ragged >= RESERVED_IDS)
        text = tokenizer.tokenizer.detokenize(ragged)
    text = tf.reshape(text, shape[:2])
    return tf.where(empty[:, tf.newaxis], tf.constant(""), text)
