import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import Decoder, DecoderLayer, Encoder, EncoderLayer, masks
from tests.layer_test import run_layer_test

RNG = np.random.default_rng(3)
X = RNG.normal(size=(2, 4, 8)).astype(np.float32)
MEM = RNG.normal(size=(2, 5, 8)).astype(np.float32)
BLOCK = {"d_model": 8, "num_heads": 2, "d_ff": 16, "dropout_rate": 0.1}


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer(norm_first):
    run_layer_test(
        EncoderLayer,
        {**BLOCK, "norm_first": norm_first},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=12,
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer(norm_first):
    run_layer_test(
        DecoderLayer,
        {**BLOCK, "norm_first": norm_first},
        (X, MEM),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=20,
    )


def test_encoder_stack():
    # 2 layers x 12 weights, + final norm (2) when norm_first
    run_layer_test(
        Encoder,
        {**BLOCK, "num_layers": 2},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=24,
    )
    run_layer_test(
        Encoder,
        {**BLOCK, "num_layers": 2, "norm_first": True},
        (X,),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=26,
    )


def test_decoder_stack():
    run_layer_test(
        Decoder,
        {**BLOCK, "num_layers": 2},
        (X, MEM),
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=40,
    )


def test_post_norm_outputs_are_normalized():
    out = EncoderLayer(**BLOCK)(X).numpy()
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-3)


def test_dropout_only_in_training():
    layer = EncoderLayer(**{**BLOCK, "dropout_rate": 0.5})
    np.testing.assert_allclose(layer(X, training=False), layer(X, training=False))
    assert not np.allclose(layer(X, training=True), layer(X, training=False))


def test_encoder_ignores_padded_positions():
    ids = tf.constant([[3, 4, 5, 0], [6, 7, 8, 9]])
    encoder = Encoder(**BLOCK, num_layers=2)
    mask = masks.key_padding_mask(ids)
    out = encoder(X, attention_mask=mask).numpy()
    noisy = X.copy()
    noisy[0, 3] += 100.0  # change the content at a padded position
    out2 = encoder(noisy, attention_mask=mask).numpy()
    np.testing.assert_allclose(out2[0, :3], out[0, :3], rtol=1e-5, atol=1e-5)


def test_decoder_is_causal():
    decoder = Decoder(**BLOCK, num_layers=2)
    causal = masks.causal_mask(4)
    out = decoder(X, MEM, self_attention_mask=causal).numpy()
    later = X.copy()
    later[:, 2:] = RNG.normal(size=later[:, 2:].shape)
    out2 = decoder(later, MEM, self_attention_mask=causal).numpy()
    np.testing.assert_allclose(out2[:, :2], out[:, :2], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out2[:, 2:], out[:, 2:])
