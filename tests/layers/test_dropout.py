import keras
import numpy as np
import tensorflow as tf

from keras_transformer.layers import Dropout
from tests.layer_test import run_layer_test

X = np.random.default_rng(2).normal(size=(2, 5, 8)).astype(np.float32)


def test_dropout_layer():
    run_layer_test(
        Dropout,
        {"rate": 0.25, "seed": 7},
        (X,),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=0,
    )


def test_without_replicas_it_is_keras_dropout_bit_for_bit():
    """On one device (and in tf.function) the masks and the RNG state are Keras' own: a run
    on one device gives the weights it gave before replicas drew their own masks."""
    ours, theirs = Dropout(0.3, seed=11), keras.layers.Dropout(0.3, seed=11)
    for _ in range(3):  # the state advances alike from call to call
        np.testing.assert_array_equal(ours(X, training=True), theirs(X, training=True))
    np.testing.assert_array_equal(
        tf.function(lambda x: ours(x, training=True))(X), theirs(X, training=True)
    )
    np.testing.assert_array_equal(ours.seed_generator.state, theirs.seed_generator.state)
    np.testing.assert_array_equal(ours(X, training=False), X)


def test_noise_shape():
    layer = Dropout(0.5, noise_shape=(None, 1, 8), seed=3)
    out = layer(X, training=True).numpy()
    kept = out != 0
    assert np.all(kept == kept[:, :1, :])  # one mask per row, broadcast over positions
