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


def test_loss_config_round_trip():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2)
    assert LabelSmoothedCrossEntropy.from_config(loss.get_config()).label_smoothing == 0.2
    assert tf.is_tensor(loss(LABELS, LOGITS))
