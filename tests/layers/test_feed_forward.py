import numpy as np

from keras_transformer.layers import PositionwiseFeedForward
from tests.layer_test import run_layer_test

X = np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32)


def test_feed_forward_layer():
    run_layer_test(
        PositionwiseFeedForward,
        {"d_model": 8, "d_ff": 16, "ffn_dropout": 0.0},
        (X,),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=4,
    )


def test_feed_forward_is_the_papers_formula_position_by_position():
    layer = PositionwiseFeedForward(d_model=8, d_ff=16)
    out = layer(X).numpy()
    w1, b1, w2, b2 = (w.numpy() for w in layer.weights)
    np.testing.assert_allclose(out, np.maximum(0, X @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-5)
    # position-wise: permuting positions permutes outputs
    np.testing.assert_allclose(layer(X[:, ::-1]).numpy(), out[:, ::-1], rtol=1e-5, atol=1e-6)
