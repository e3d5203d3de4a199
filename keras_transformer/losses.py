"""Label-smoothed cross-entropy over real tokens, and masked token accuracy (section 5.4)."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.config import PAD_ID


def label_smoothed_nll(labels, logits, label_smoothing: float):
    """Per-token loss (B, T) float32 against q = (1 - eps) one_hot + eps / V; pads give 0.

    One fused softmax-cross-entropy kernel over the smoothed targets: its gradient is
    softmax - q, with no scatter (a gather's gradient would be an (N, V) segment sum).
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    vocab = tf.shape(logits)[-1]
    if label_smoothing:
        off = label_smoothing / tf.cast(vocab, tf.float32)
        targets = tf.one_hot(labels, vocab, on_value=1.0 - label_smoothing + off, off_value=off)
        nll = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    else:
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.where(tf.not_equal(labels, PAD_ID), nll, 0.0)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy with label smoothing, averaged over real (non-pad) target tokens.

    `keras_transformer.training.TrainingModel` (training/step.py) uses `sum_and_count` to
    divide by the real tokens of the *global* batch, so N replicas and k accumulation steps
    give the one-device update.

    Args:
        label_smoothing: epsilon_ls (paper: 0.1).

    Call arguments:
        y_true: (B, T) int target ids, pad 0.
        y_pred: (B, T, V) logits.

    Returns:
        scalar float32: sum of token losses / number of real tokens.
    """

    def __init__(
        self, label_smoothing: float = 0.1, name: str = "label_smoothed_cross_entropy", **kwargs
    ):
        kwargs.pop("reduction", None)
        super().__init__(name=name, reduction="none", **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing

    def sum_and_count(self, y_true, y_pred):
        """(sum of token losses, number of real tokens), both float32 scalars."""
        losses = label_smoothed_nll(y_true, y_pred, self.label_smoothing)
        count = tf.reduce_sum(tf.cast(tf.not_equal(y_true, PAD_ID), tf.float32))
        return tf.reduce_sum(losses), count

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(
                "LabelSmoothedCrossEntropy masks pads itself; sample_weight is not supported"
            )
        total, count = self.sum_and_count(y_true, y_pred)
        return total / tf.maximum(count, 1.0)

    def call(self, y_true, y_pred):
        return label_smoothed_nll(y_true, y_pred, self.label_smoothing)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.SparseCategoricalAccuracy):
    """Token accuracy (argmax of logits == target) over non-pad targets, accumulated over
    every real token seen: Keras' `SparseCategoricalAccuracy` with the pad mask as
    `sample_weight`.

    The tokens are flattened first: given a 2-D `sample_weight`, Keras' mean metrics
    average each row over its T positions and weigh the row by its mean weight, which
    counts a token of a batch of length T by 1 / T, so batches of different lengths
    would not count token by token.

    update_state(y_true (B, T) int, y_pred (B, T, V) logits, sample_weight None or
    broadcastable to (B, T): multiplies the pad mask).
    """

    def __init__(self, name: str = "accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = tf.cast(y_true, tf.int32)
        weight = tf.cast(tf.not_equal(y_true, PAD_ID), self.dtype)
        if sample_weight is not None:
            weight *= tf.cast(sample_weight, self.dtype)
        return super().update_state(
            tf.reshape(y_true, [-1]),
            # float32: Keras compares the ids cast to the logits' dtype (inexact in 16 bits)
            tf.reshape(tf.cast(y_pred, tf.float32), [-1, tf.shape(y_pred)[-1]]),
            sample_weight=tf.reshape(weight, [-1]),
        )
