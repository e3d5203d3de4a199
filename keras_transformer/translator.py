"""Translator: raw strings in, translations and scores out, all in one TensorFlow graph."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, SubwordTokenizer

STRINGS = tf.TensorSpec([None], tf.string, name="inputs")


class Translator(tf.Module):
    """Holds the tokenizer and the model; `tf.saved_model.save` exports it whole.

    Args:
        model: a built `Transformer`.
        tokenizer: the `SubwordTokenizer` it was trained with.
        beam_size: K (paper: 4); 1 with alpha 0 is greedy search.
        alpha: length penalty exponent (paper: 0.6).
        max_extra_length: outputs may be this many tokens longer than the input (paper: 50).
        max_input_length: inputs are truncated to this many tokens, eos included
            (default: the model's `max_length`).

    `translator(strings (B,))` -> {"outputs": (B,) string, "scores": (B,) float32};
    `translator.translate_nbest(strings)` -> {"outputs": (B, K), "scores": (B, K)}.
    Empty and whitespace-only inputs give "" with score 0; invalid UTF-8 bytes are
    replaced by U+FFFD before tokenization.
    """

    def __init__(
        self,
        model,
        tokenizer: SubwordTokenizer,
        *,
        beam_size: int = 4,
        alpha: float = 0.6,
        max_extra_length: int = 50,
        max_input_length: int | None = None,
        name: str = "translator",
    ):
        super().__init__(name=name)
        if beam_size < 1 or max_extra_length < 1:
            raise ValueError(
                f"beam_size and max_extra_length must be >= 1, got {beam_size}, {max_extra_length}"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.beam_size = beam_size
        self.alpha = alpha
        self.max_extra_length = max_extra_length
        self.max_input_length = max_input_length or model.config.max_length
        # learned positions have a table; sinusoidal ones have no limit
        self.max_output_length = (
            model.config.max_length if model.config.positional == "learned" else None
        )

    def _encode_inputs(self, sentences):
        clean = tf.strings.unicode_transcode(
            sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        ids = self.tokenizer.tokenize(clean)[:, : self.max_input_length - 1]
        eos = tf.fill([tf.shape(sentences)[0], 1], EOS_ID)
        source = tf.concat([ids, eos], axis=1)
        empty = tf.equal(tf.strings.length(tf.strings.strip(clean)), 0)
        return source.to_tensor(), source.row_lengths(), empty

    def search(self, sentences, beam_size: int):
        """(B,) strings -> (ids (B, K, L), scores (B, K), empty (B,) bool)."""
        source, lengths, empty = self._encode_inputs(sentences)
        max_lengths = tf.cast(lengths, tf.int32) + self.max_extra_length
        if self.max_output_length is not None:
            max_lengths = tf.minimum(max_lengths, self.max_output_length)
        memory = self.model.encode(source)
        cache = self.model.init_cache(memory, source, tf.maximum(tf.reduce_max(max_lengths), 1))
        bos = tf.fill([tf.shape(source)[0]], BOS_ID)
        ids, scores = decoding.beam_search(
            self.model.decode_step,
            bos,
            cache,
            max_lengths,
            EOS_ID,
            beam_size=beam_size,
            alpha=self.alpha,
        )
        return ids, scores, empty

    def _detokenize(self, ids, empty):
        """(B, K, L) ids -> (B, K) strings; "" where the input was empty."""
        shape = tf.shape(ids)
        flat = tf.reshape(ids, [-1, shape[2]])
        lengths = tf.reduce_sum(
            tf.cast(
                tf.math.cumsum(tf.cast(tf.equal(flat, EOS_ID), tf.int32), axis=1) == 0, tf.int32
            ),
            1,
        )
        text = self.tokenizer.detokenize(tf.RaggedTensor.from_tensor(flat, lengths=lengths))
        text = tf.reshape(text, shape[:2])
        return tf.where(empty[:, tf.newaxis], tf.constant(""), text)

    @tf.function(input_signature=[STRINGS])
    def __call__(self, inputs):
        ids, scores, empty = self.search(inputs, self.beam_size)
        text = self._detokenize(ids[:, :1], empty)[:, 0]
        return {"outputs": text, "scores": tf.where(empty, 0.0, scores[:, 0])}

    @tf.function(input_signature=[STRINGS])
    def translate_nbest(self, inputs):
        ids, scores, empty = self.search(inputs, self.beam_size)
        return {
            "outputs": self._detokenize(ids, empty),
            "scores": tf.where(empty[:, tf.newaxis], 0.0, scores),
        }
