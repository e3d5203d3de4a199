"""The exported signatures' inputs and the in-graph checks of their option values.

Every input is batch-major, `[B, ...]`, so that TF Serving's `--enable_batching` can
concatenate requests of any signature along axis 0: the options are per-sentence vectors.
A bad value is an InvalidArgument error naming the signature and the input.
"""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.config import STOP_RULES

# the checks of the options' Python values, kept importable from here
from keras_transformer.settings.decoding import (  # noqa: F401
    MAX_BEAM_SIZE,
    MAX_EXTRA_LENGTH_LIMIT,
    DecodingOptionsError,
    check_min_length,
    check_options,
    check_sampling,
    check_stop_rule,
)

STRINGS = tf.TensorSpec([None], tf.string, name="inputs")


def signature(input_signature):
    """A Translator signature's `tf.function`, without autograph: the searches are explicit
    `tf.while_loop`s, so converting the code they call (the model, the beam bookkeeping)
    changes no op, and skipping it traces a search in a third of the time (tiny model, first
    call: 7.0 s against 2.3 s): once per kt-train process (validation BLEU) and per export."""
    return tf.function(input_signature=input_signature, autograph=False)


OPTIONS = [
    STRINGS,
    tf.TensorSpec([None], tf.int32, name="beam_size"),
    tf.TensorSpec([None], tf.float32, name="alpha"),
    tf.TensorSpec([None], tf.int32, name="max_extra_length"),
    tf.TensorSpec([None], tf.int32, name="num_hypotheses"),
    tf.TensorSpec([None], tf.string, name="target_prefix"),
]
# `translate_with_stop_rule`: the options and a stop rule per sentence, a name of
# config.STOP_RULES or "" for the export's (--stop-rule). A signature of its own, so that
# `translate_with_options` keeps 0.1.0's inputs: TF Serving refuses a request that omits an
# input without a SignatureDef default, and a default (a fixed [1] tensor, fed as it is)
# breaks a request of several sentences under --enable_batching
STOP_RULE_OPTIONS = [*OPTIONS, tf.TensorSpec([None], tf.string, name="stop_rule")]
SCORE = [STRINGS, tf.TensorSpec([None], tf.string, name="targets")]
SAMPLE = [
    STRINGS,
    tf.TensorSpec([None], tf.float32, name="temperature"),
    tf.TensorSpec([None], tf.int32, name="top_k"),
    tf.TensorSpec([None], tf.float32, name="top_p"),
    tf.TensorSpec([None], tf.int64, name="seed"),
]
# the XLA search's shapes to compile, [P, C, S, K, W] a row (`Translator.xla_warmup`)
XLA_SHAPES = tf.TensorSpec([None, 5], tf.int32, name="shapes")
# every option's dtype, for callers that build the (B,) vectors
DTYPES = {spec.name: spec.dtype for spec in [*STOP_RULE_OPTIONS[1:], *SAMPLE[1:], XLA_SHAPES]}


def stop_rule_codes(stop_rule, default: int):
    """(B,) stop-rule names ("" for `default`) -> (B,) int32 codes (config.STOP_RULES' order;
    checked by `assert_options`)."""
    codes = tf.fill(tf.shape(stop_rule), default)
    for code, name in enumerate(STOP_RULES):
        codes = tf.where(tf.equal(stop_rule, name), code, codes)
    return codes


def _check(signature, name, ok, requirement, value):
    return tf.debugging.Assert(
        tf.reduce_all(ok),
        [f"{signature}: input {name} must be {requirement}, got", value],
        name=f"check_{name}",
        summarize=8,
    )


def _one_per_sentence(signature, inputs, named):
    batch = tf.shape(inputs)[0]
    return [
        _check(signature, name, tf.equal(tf.shape(v)[0], batch), "one value per input", tf.shape(v))
        for name, v in named.items()
    ]


def assert_options(
    sig, inputs, beam_size, alpha, max_extra_length, num_hypotheses, target_prefix, stop_rule
):
    """In-graph checks of the inputs of signature `sig` (`translate_with_options` or
    `translate_with_stop_rule`; a list of Assert ops)."""
    named = dict(
        beam_size=beam_size,
        alpha=alpha,
        max_extra_length=max_extra_length,
        num_hypotheses=num_hypotheses,
        target_prefix=target_prefix,
        stop_rule=stop_rule,
    )
    known = tf.equal(stop_rule, "")
    for name in STOP_RULES:
        known = tf.logical_or(known, tf.equal(stop_rule, name))
    return _one_per_sentence(sig, inputs, named) + [
        _check(sig, "beam_size", (beam_size >= 1) & (beam_size <= MAX_BEAM_SIZE),
               f"in [1, {MAX_BEAM_SIZE}]", beam_size),
        _check(sig, "alpha", tf.math.is_finite(alpha) & (alpha >= 0.0),
               "a finite number >= 0", alpha),
        _check(sig, "max_extra_length",
               (max_extra_length >= 1) & (max_extra_length <= MAX_EXTRA_LENGTH_LIMIT),
               f"in [1, {MAX_EXTRA_LENGTH_LIMIT}]", max_extra_length),
        _check(sig, "num_hypotheses", (num_hypotheses >= 1) & (num_hypotheses <= beam_size),
               "in [1, beam_size]", num_hypotheses),
        _check(sig, "stop_rule", known, f"one of {', '.join(STOP_RULES)} or \"\"", stop_rule),
    ]  # fmt: skip


def assert_sampling(inputs, temperature, top_k, top_p, seed):
    """In-graph checks of `sample`'s inputs (a list of Assert ops)."""
    sig = "sample"
    named = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    return _one_per_sentence(sig, inputs, named) + [
        _check(sig, "temperature", tf.math.is_finite(temperature) & (temperature > 0.0),
               "a finite number > 0", temperature),
        _check(sig, "top_k", top_k >= 0, ">= 0 (0: no limit)", top_k),
        _check(sig, "top_p", (top_p > 0.0) & (top_p <= 1.0), "in (0, 1]", top_p),
    ]  # fmt: skip


def assert_same_length(inputs, targets):
    return _one_per_sentence("score", inputs, {"targets": targets})


def checked(checks, *values):
    """`values` computed only after every check passed."""
    with tf.control_dependencies(checks):
        return [tf.identity(v) for v in values]
