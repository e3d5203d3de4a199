"""Translator: raw strings in, translations and scores out, all in one TensorFlow graph."""

from __future__ import annotations

import math

import tensorflow as tf

from keras_transformer import config
from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.errors import KerasTransformerError
from keras_transformer.inference import search

STRINGS = tf.TensorSpec([None], tf.string, name="inputs")
# `translate_with_options`: the strings plus four scalars, chosen per request
OPTIONS = [
    STRINGS,
    tf.TensorSpec([], tf.int32, name="beam_size"),
    tf.TensorSpec([], tf.float32, name="alpha"),
    tf.TensorSpec([], tf.int32, name="max_extra_length"),
    tf.TensorSpec([], tf.int32, name="num_hypotheses"),
]
MAX_BEAM_SIZE = 64  # per-request bounds: a request cannot ask for unbounded memory or time
MAX_EXTRA_LENGTH = 1024


class DecodingOptionsError(KerasTransformerError, ValueError):
    """A decoding option out of range; the message names the option and the value, and
    `option` holds its name (command lines map it to their flag)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option} {message}")
        self.option = option


def check_options(beam_size: int, alpha: float, max_extra_length: int) -> None:
    """Raise `DecodingOptionsError` naming the first option out of range."""
    if not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise DecodingOptionsError("beam_size", f"must be in [1, {MAX_BEAM_SIZE}], got {beam_size}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise DecodingOptionsError("alpha", f"must be a finite number >= 0, got {alpha}")
    if not 1 <= max_extra_length <= MAX_EXTRA_LENGTH:
        raise DecodingOptionsError(
            "max_extra_length", f"must be in [1, {MAX_EXTRA_LENGTH}], got {max_extra_length}"
        )


def _assert_options(beam_size, alpha, max_extra_length, num_hypotheses):
    """In-graph checks: a bad value is an InvalidArgument error naming the input."""

    def between(value, low, high, name):
        return tf.debugging.Assert(
            tf.logical_and(value >= low, value <= high),
            [f"translate_with_options: input {name} must be in [{low}, {high}], got", value],
            name=f"check_{name}",
        )

    return [
        between(beam_size, 1, MAX_BEAM_SIZE, "beam_size"),
        tf.debugging.Assert(
            tf.logical_and(tf.math.is_finite(alpha), alpha >= 0.0),
            ["translate_with_options: input alpha must be a finite number >= 0, got", alpha],
            name="check_alpha",
        ),
        between(max_extra_length, 1, MAX_EXTRA_LENGTH, "max_extra_length"),
        tf.debugging.Assert(
            tf.logical_and(num_hypotheses >= 1, num_hypotheses <= beam_size),
            [
                "translate_with_options: input num_hypotheses must be in [1, beam_size], got",
                num_hypotheses,
                beam_size,
            ],
            name="check_num_hypotheses",
        ),
    ]


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
    `translator.translate_nbest(strings)` -> {"outputs": (B, K), "scores": (B, K)};
    `translator.translate_with_options(strings, beam_size, alpha, max_extra_length,
    num_hypotheses)` -> {"outputs": (B, n), "scores": (B, n)}, the options being scalars
    chosen per call (bad values: InvalidArgumentError naming the input).
    Empty and whitespace-only inputs give "" with score 0; invalid UTF-8 bytes are
    replaced by U+FFFD before tokenization.
    """

    def __init__(
        self,
        model,
        tokenizer: SubwordTokenizer,
        *,
        beam_size: int = config.BEAM_SIZE,
        alpha: float = config.ALPHA,
        max_extra_length: int = config.MAX_EXTRA_LENGTH,
        max_input_length: int | None = None,
        name: str = "translator",
    ):
        super().__init__(name=name)
        check_options(beam_size, alpha, max_extra_length)
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

    def search(self, sentences, beam_size, alpha=None, max_extra_length=None):
        """(B,) strings -> (ids (B, K, L), scores (B, K), empty (B,) bool).

        The options may be Python numbers or scalar tensors (default: the constructor's).
        """
        alpha = self.alpha if alpha is None else alpha
        extra = self.max_extra_length if max_extra_length is None else max_extra_length
        source, lengths, empty = self._encode_inputs(sentences)
        max_lengths = tf.cast(lengths, tf.int32) + extra
        if self.max_output_length is not None:
            max_lengths = tf.minimum(max_lengths, self.max_output_length)
        memory = self.model.encode(source)
        cache = self.model.init_cache(memory, source)
        bos = tf.fill([tf.shape(source)[0]], BOS_ID)
        ids, scores = search.beam_search(
            self.model.decode_step,
            bos,
            cache,
            max_lengths,
            EOS_ID,
            beam_size=beam_size,
            alpha=alpha,
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

    def _nbest(self, ids, scores, empty):
        return {
            "outputs": self._detokenize(ids, empty),
            "scores": tf.where(empty[:, tf.newaxis], 0.0, scores),
        }

    @tf.function(input_signature=[STRINGS])
    def __call__(self, inputs):
        ids, scores, empty = self.search(inputs, self.beam_size)
        text = self._detokenize(ids[:, :1], empty)[:, 0]
        return {"outputs": text, "scores": tf.where(empty, 0.0, scores[:, 0])}

    @tf.function(input_signature=[STRINGS])
    def translate_nbest(self, inputs):
        return self._nbest(*self.search(inputs, self.beam_size))

    @tf.function(input_signature=OPTIONS)
    def translate_with_options(self, inputs, beam_size, alpha, max_extra_length, num_hypotheses):
        checks = _assert_options(beam_size, alpha, max_extra_length, num_hypotheses)
        with tf.control_dependencies(checks):  # nothing is computed from a bad value
            beam_size, alpha, max_extra_length, num_hypotheses = map(
                tf.identity, (beam_size, alpha, max_extra_length, num_hypotheses)
            )
        ids, scores, empty = self.search(inputs, beam_size, alpha, max_extra_length)
        return self._nbest(ids[:, :num_hypotheses], scores[:, :num_hypotheses], empty)
