import math

import numpy as np
import pytest

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


@pytest.mark.parametrize(
    "activation,formula",
    [
        ("swish", lambda h: h / (1.0 + np.exp(-h))),
        ("gelu", lambda h: 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))),
        ("gelu_sigmoid", lambda h: h / (1.0 + np.exp(-1.702 * h))),
        ("relu", lambda h: np.maximum(h, 0.0)),
    ],
)
def test_feed_forward_activations_match_their_numpy_formulas(activation, formula):
    layer = PositionwiseFeedForward(d_model=8, d_ff=16, activation=activation)
    out = layer(X).numpy()
    w1, b1, w2, b2 = (v.numpy() for v in layer.weights)
    np.testing.assert_allclose(out, formula(X @ w1 + b1) @ w2 + b2, rtol=1e-4, atol=1e-5)
    config = layer.get_config()
    assert config.get("activation", "relu") == activation
    assert PositionwiseFeedForward.from_config(config).activation == activation


def test_feed_forward_swish_layer_round_trips():
    run_layer_test(
        PositionwiseFeedForward,
        {"d_model": 8, "d_ff": 16, "ffn_dropout": 0.0, "activation": "swish"},
        (X,),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=4,
    )


def test_unknown_activation_is_a_value_error():
    with pytest.raises(ValueError, match="ffn_activation must be one of"):
        PositionwiseFeedForward(d_model=8, d_ff=16, activation="tanh")
