import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import MultiHeadAttention, ScaledDotProductAttention, masks
from keras_transformer.layers.attention_cache import RECENT_STEPS
from tests.layer_test import run_layer_test
from tests.layers import reference

RNG = np.random.default_rng(2)
Q = RNG.normal(size=(2, 3, 4, 6)).astype(np.float32)  # (B, h, T, d_k)
K = RNG.normal(size=(2, 3, 5, 6)).astype(np.float32)  # (B, h, S, d_k)
V = RNG.normal(size=(2, 3, 5, 6)).astype(np.float32)
X = RNG.normal(size=(2, 4, 12)).astype(np.float32)
MEM = RNG.normal(size=(2, 5, 12)).astype(np.float32)
SRC = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]], np.int32)


def test_scaled_dot_product_attention_layer():
    run_layer_test(
        ScaledDotProductAttention,
        {"attention_dropout": 0.0},
        (Q, K, V),
        expected_output_shape=(2, 3, 4, 6),
        expected_num_trainable_weights=0,
    )


def test_attention_is_the_papers_formula_and_masks_keys():
    mask = masks.key_padding_mask(tf.constant(SRC))
    out, weights = ScaledDotProductAttention()(Q, K, V, attention_mask=mask)
    weights = weights.numpy()
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    assert np.all(weights[0, :, :, 3:] == 0.0)  # padded keys get exactly zero weight
    scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(6)
    scores[0, :, :, 3:] = -np.inf
    expected = np.exp(scores - scores.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.numpy(), expected @ V, rtol=1e-5, atol=1e-5)


def test_fully_masked_row_is_finite_in_float16():
    mask = tf.zeros([2, 1, 1, 5], tf.bool)
    layer = ScaledDotProductAttention(dtype="mixed_float16")
    out, weights = layer(
        tf.constant(Q, tf.float16),
        tf.constant(K, tf.float16),
        tf.constant(V, tf.float16),
        attention_mask=mask,
    )
    assert np.all(np.isfinite(out.numpy().astype(np.float32)))
    np.testing.assert_allclose(weights.numpy(), 0.2, rtol=1e-3)


def test_self_attention_layer():
    run_layer_test(
        MultiHeadAttention,
        {"num_heads": 3, "d_model": 12, "self_attention": True},
        (X,),
        expected_output_shape=(2, 4, 12),
        expected_num_trainable_weights=4,
    )


def test_cross_attention_layer():
    run_layer_test(
        MultiHeadAttention,
        {"num_heads": 3, "d_model": 12, "self_attention": False, "d_k": 2, "d_v": 5},
        (X, MEM),
        expected_output_shape=(2, 4, 12),
        expected_num_trainable_weights=6,
    )


@pytest.mark.parametrize("self_attention", [True, False])
@pytest.mark.parametrize("depths", [(4, 4), (2, 5), (8, 3)])
def test_multi_head_attention_is_the_papers_formula(self_attention, depths):
    d_k, d_v = depths
    layer = MultiHeadAttention(
        num_heads=3, d_model=12, d_k=d_k, d_v=d_v, self_attention=self_attention
    )
    layer.build()
    reference.randomize(layer)
    if self_attention:  # one fused (d_model, h d_k + h d_k + h d_v) projection
        assert layer.qkv_kernel.shape == (12, 3 * (2 * d_k + d_v))
        memory, mask = None, masks.causal_mask(4)
    else:
        assert layer.q_kernel.shape == (12, 3 * d_k)
        assert layer.kv_kernel.shape == (12, 3 * (d_k + d_v))
        memory, mask = MEM, masks.key_padding_mask(tf.constant(SRC))
    assert layer.output_kernel.shape == (3 * d_v, 12)
    args = (X,) if memory is None else (X, memory)
    expected = reference.multi_head_attention(layer, X, memory, mask.numpy()[:, 0])
    np.testing.assert_allclose(layer(*args, attention_mask=mask), expected, rtol=1e-4, atol=1e-4)


def test_heads_have_depth_d_model_over_h_and_weights_sum_to_one():
    layer = MultiHeadAttention(
        num_heads=3, d_model=12, self_attention=False, return_attention_scores=True
    )
    mask = masks.key_padding_mask(tf.constant(SRC))
    _, weights = layer(X, MEM, attention_mask=mask)
    assert weights.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(weights.numpy().sum(-1), 1.0, rtol=1e-6)
    assert np.all(weights.numpy()[0, :, :, 3:] == 0.0)
    assert layer.q_kernel.shape == (12, 12) and layer.kv_kernel.shape == (12, 24)


@pytest.mark.parametrize("scores", [False, True])
def test_cached_self_attention_equals_causal_full_attention(scores):
    layer = MultiHeadAttention(num_heads=3, d_model=12, d_v=5, return_attention_scores=scores)
    full = layer(X, attention_mask=masks.causal_mask(4))
    full = (full[0] if scores else full).numpy()
    cache = {"k": tf.zeros([2, 3, 0, 4]), "v": tf.zeros([2, 3, 0, 5])}  # grows per step
    for t in range(4):
        outputs = layer(X[:, t : t + 1], cache=cache, step=t)
        assert len(outputs) == 2 + scores  # (outputs, cache[, weights]): the scores are kept
        out, cache = outputs[:2]
        if scores:
            weights = outputs[2].numpy()
            assert weights.shape == (2, 3, 1, t + 1)  # the t + 1 positions decoded so far
            np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(out.numpy()[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_key_blocks_equal_their_concatenation():
    split = [K[:, :, :2], K[:, :, 2:]], [V[:, :, :2], V[:, :, 2:]]
    mask = masks.key_padding_mask(tf.constant(SRC))
    layer = ScaledDotProductAttention()
    out, weights = layer(Q, *split, attention_mask=mask)
    expected, expected_weights = layer(Q, K, V, attention_mask=mask)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-6, atol=1e-7)


def test_two_block_cache_equals_causal_full_attention_across_moves():
    """A cache in a main and a recent block: the recent block moves into the main one every
    RECENT_STEPS steps, and every step still equals full causal attention."""
    steps = RECENT_STEPS + 4
    x = RNG.normal(size=(2, steps, 12)).astype(np.float32)
    layer = MultiHeadAttention(num_heads=3, d_model=12)
    full = layer(x, attention_mask=masks.causal_mask(steps)).numpy()
    empty = tf.zeros([2, 3, 0, 4])
    cache = {"k": empty, "v": empty, "recent_k": empty, "recent_v": empty}
    for t in range(steps):
        out, cache = layer(x[:, t : t + 1], cache=cache, step=t)
        main, recent = cache["k"].shape[2], cache["recent_k"].shape[2]
        assert main + recent == t + 1 and main % RECENT_STEPS == 0
        assert recent < RECENT_STEPS
        np.testing.assert_allclose(out.numpy()[:, 0], full[:, t], rtol=1e-5, atol=1e-5)
    assert cache["k"].shape[2] == RECENT_STEPS  # it moved once


def test_cached_cross_attention_equals_uncached():
    layer = MultiHeadAttention(num_heads=3, d_model=12, self_attention=False)
    mask = masks.key_padding_mask(tf.constant(SRC))
    expected = layer(X, MEM, attention_mask=mask).numpy()
    out = layer(X, attention_mask=mask, projected_memory=layer.project_memory(MEM))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        MultiHeadAttention(num_heads=5, d_model=12)
    with pytest.raises(ValueError, match="d_k must be a positive integer"):
        MultiHeadAttention(num_heads=3, d_model=12, d_k=0)
    assert MultiHeadAttention(num_heads=5, d_model=12, d_k=3, d_v=3)(X).shape == (2, 4, 12)
    with pytest.raises(ValueError, match="takes no `memory`"):
        MultiHeadAttention(num_heads=3, d_model=12)(X, MEM)
    cross = MultiHeadAttention(num_heads=3, d_model=12, self_attention=False)
    with pytest.raises(ValueError, match="exactly one of `memory` and `projected_memory`"):
        cross(X)
    with pytest.raises(ValueError, match="exactly one of `memory` and `projected_memory`"):
        cross(X, MEM, projected_memory=cross.project_memory(MEM))
    with pytest.raises(ValueError, match="keeps no cache"):
        cross(X, MEM, cache={"k": tf.zeros([2, 3, 6, 4]), "v": tf.zeros([2, 3, 6, 4])}, step=0)
    with pytest.raises(ValueError, match="cache and `step` go together"):
        MultiHeadAttention(num_heads=3, d_model=12)(X[:, :1], step=0)
