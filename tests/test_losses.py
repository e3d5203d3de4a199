import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy

RNG = np.random.default_rng(4)
LOGITS = RNG.normal(size=(2, 3, 7)).astype(np.float32)
LABELS = np.array([[4, 5, 0], [6, 0, 0]], np.int32)


def reference(labels, logits, eps):
    """Explicit smoothed distribution q, mean over real tokens."""
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = np.full(logits.shape, eps / logits.shape[-1])
    for idx in np.ndindex(labels.shape):
        q[idx + (labels[idx],)] += 1 - eps
    per_token = -(q * log_p).sum(-1)
    real = labels != 0
    return per_token[real].sum() / real.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_loss_matches_the_smoothed_distribution(eps):
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    assert float(loss(LABELS, LOGITS)) == pytest.approx(reference(LABELS, LOGITS, eps), rel=1e-5)


def test_pads_do_not_count():
    loss = LabelSmoothedCrossEntropy()
    other = LOGITS.copy()
    other[0, 2] += 50.0  # a padded position
    assert float(loss(LABELS, other)) == pytest.approx(float(loss(LABELS, LOGITS)), rel=1e-6)
    total, count = loss.sum_and_count(LABELS, LOGITS)
    assert float(count) == 3.0


def test_masked_accuracy_ignores_pads():
    logits = np.zeros((1, 3, 5), np.float32)
    logits[0, 0, 2] = logits[0, 1, 1] = logits[0, 2, 3] = 1.0
    metric = MaskedAccuracy()
    metric.update_state(np.array([[2, 4, 0]]), logits)
    assert float(metric.result()) == pytest.approx(0.5)


def padded_batches(seed=0):
    """Batches of different lengths, with pads at the end of rows (and a fully padded row)."""
    rng = np.random.default_rng(seed)
    batches = []
    for length in (2, 5, 9):
        labels = rng.integers(1, 6, size=(3, length)).astype(np.int32)
        labels[0, length // 2 :] = 0
        labels[2] = 0
        logits = rng.normal(size=(3, length, 6)).astype(np.float32)
        logits[1, 0, labels[1, 0]] += 10.0  # at least one hit per batch
        batches.append((labels, logits))
    return batches


def test_masked_accuracy_is_keras_accuracy_weighted_by_the_pad_mask():
    for labels, logits in padded_batches():
        ours = MaskedAccuracy()
        ours.update_state(labels, logits)
        keras_metric = keras.metrics.SparseCategoricalAccuracy()
        keras_metric.update_state(labels, logits, sample_weight=labels != 0)
        assert float(ours.result()) == pytest.approx(float(keras_metric.result()), rel=1e-6)


def test_masked_accuracy_counts_every_real_token_alike_across_batches():
    metric = MaskedAccuracy()
    hits = real = 0
    for labels, logits in padded_batches(seed=1):
        metric.update_state(labels, logits)
        hits += np.sum((logits.argmax(-1) == labels) & (labels != 0))
        real += np.sum(labels != 0)
    assert float(metric.result()) == pytest.approx(hits / real, rel=1e-6)
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_masked_accuracy_sample_weight_multiplies_the_pad_mask():
    labels, logits = padded_batches()[1]
    weight = np.array([[1.0], [0.0], [3.0]], np.float32)  # row 1 left out
    metric = MaskedAccuracy()
    metric.update_state(labels, logits, sample_weight=weight)
    mask = (labels != 0) * weight
    expected = np.sum((logits.argmax(-1) == labels) * mask) / np.sum(mask)
    assert float(metric.result()) == pytest.approx(expected, rel=1e-6)


def test_masked_accuracy_compares_large_ids_exactly_under_16_bit_logits():
    labels = np.array([[2049, 2051, 0]], np.int32)  # not exact in float16 / bfloat16
    logits = np.zeros((1, 3, 2100), np.float32)
    logits[0, 0, 2049] = logits[0, 1, 2050] = 1.0
    metric = MaskedAccuracy()
    metric.update_state(labels, tf.constant(logits, tf.bfloat16))
    assert float(metric.result()) == pytest.approx(0.5)


def test_metric_config_round_trip():
    metric = MaskedAccuracy(name="token_accuracy")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert type(clone) is MaskedAccuracy and clone.get_config() == metric.get_config()


def test_loss_config_round_trip():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2)
    assert LabelSmoothedCrossEntropy.from_config(loss.get_config()).label_smoothing == 0.2
    assert tf.is_tensor(loss(LABELS, LOGITS))
