import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import MultiHeadAttention, PositionwiseFeedForward, Residual
from tests.layer_test import run_layer_test
from tests.layers import reference

X = np.random.default_rng(4).normal(size=(2, 5, 8)).astype(np.float32)


def ffn(dtype=None):
    return PositionwiseFeedForward(d_model=8, d_ff=16, dtype=dtype, name="sublayer")


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_layer(norm_first):
    run_layer_test(
        Residual,
        lambda dtype: {"sublayer": ffn(dtype), "dropout_rate": 0.1, "norm_first": norm_first},
        (X,),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=6,  # the sublayer's 4 and the norm's 2
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_is_the_papers_sublayer_connection(norm_first):
    block = Residual(ffn(), dropout_rate=0.3, norm_first=norm_first)
    block.build(X.shape)
    reference.randomize(block)
    expected = reference.residual(block, X, lambda y: reference.feed_forward(block.sublayer, y))
    np.testing.assert_allclose(block(X), expected, rtol=1e-4, atol=1e-4)
    # residual dropout acts on the sublayer output only: with a zero sublayer it is the identity
    zero = Residual(ffn(), dropout_rate=0.5, norm_first=True)
    zero.build(X.shape)
    zero.set_weights([np.zeros(w.shape) for w in zero.get_weights()])
    np.testing.assert_allclose(zero(X, training=True), X, atol=1e-6)


def test_extra_outputs_of_the_sublayer_pass_through():
    attention = MultiHeadAttention(num_heads=2, d_model=8, return_attention_scores=True)
    out, weights = Residual(attention)(X, training=False)
    assert out.shape == (2, 5, 8) and weights.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(tf.reduce_sum(weights, -1), 1.0, rtol=1e-6)


def test_bad_dropout_rate():
    with pytest.raises(ValueError, match="dropout_rate"):
        Residual(ffn(), dropout_rate=1.0)
