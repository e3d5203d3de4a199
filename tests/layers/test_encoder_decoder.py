import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import Decoder, DecoderLayer, Encoder, EncoderLayer, masks
from tests.layer_test import run_layer_test
from tests.layers import reference

RNG = np.random.default_rng(3)
X = RNG.normal(size=(2, 4, 8)).astype(np.float32)
MEM = RNG.normal(size=(2, 5, 8)).astype(np.float32)
SRC = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]], np.int32)  # pads in row 0
BLOCK = {"d_model": 8, "num_heads": 2, "d_ff": 16, "dropout_rate": 0.1}
UNEVEN = {"d_k": 3, "d_v": 5}  # Table 3 rows A/B: head depths other than d_model / h
MEM_MASK = masks.key_padding_mask(tf.constant(SRC))
CAUSAL = masks.causal_mask(4)


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
        {**BLOCK, "norm_first": norm_first, **UNEVEN},
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
        {**BLOCK, "num_layers": 2, "norm_first": True, "return_attention_scores": True},
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


@pytest.mark.parametrize("heads", [{}, UNEVEN])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_is_the_papers_formula(norm_first, heads):
    layer = EncoderLayer(**BLOCK, **heads, norm_first=norm_first)
    layer.build()
    reference.randomize(layer)
    mask = masks.key_padding_mask(tf.constant(SRC[:, :4]))
    expected = reference.encoder_layer(layer, X, mask.numpy()[:, 0])
    np.testing.assert_allclose(layer(X, attention_mask=mask), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("heads", [{}, UNEVEN])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_is_the_papers_formula(norm_first, heads):
    layer = DecoderLayer(**BLOCK, **heads, norm_first=norm_first)
    layer.build()
    reference.randomize(layer, seed=1)
    out = layer(X, MEM, self_attention_mask=CAUSAL, memory_mask=MEM_MASK)
    expected = reference.decoder_layer(layer, X, MEM, CAUSAL.numpy()[:, 0], MEM_MASK.numpy()[:, 0])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_are_their_layers_in_sequence(norm_first):
    encoder = Encoder(**BLOCK, num_layers=2, norm_first=norm_first)
    decoder = Decoder(**BLOCK, num_layers=2, norm_first=norm_first)
    for i, stack in enumerate((encoder, decoder)):
        stack.build()
        reference.randomize(stack, seed=i)
    expected = reference.stack(encoder, X, reference.encoder_layer)
    np.testing.assert_allclose(encoder(X), expected, rtol=1e-4, atol=1e-4)
    expected = reference.stack(
        decoder, X, lambda block, x: reference.decoder_layer(block, x, MEM, CAUSAL.numpy()[:, 0])
    )
    np.testing.assert_allclose(
        decoder(X, MEM, self_attention_mask=CAUSAL), expected, rtol=1e-4, atol=1e-4
    )


def test_post_norm_outputs_are_normalized():
    out = EncoderLayer(**BLOCK)(X).numpy()
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-3)


def test_dropout_only_in_training():
    layer = EncoderLayer(**{**BLOCK, "dropout_rate": 0.5})
    layer.build()
    expected = reference.encoder_layer(layer, X)  # no dropout in the reference
    np.testing.assert_allclose(layer(X, training=False), expected, rtol=1e-4, atol=1e-4)
    assert not np.allclose(layer(X, training=True), expected, atol=1e-2)


def test_return_structure_is_fixed_at_construction():
    assert isinstance(EncoderLayer(**BLOCK)(X), tf.Tensor)
    out, weights = EncoderLayer(**BLOCK, return_attention_scores=True)(X)
    assert out.shape == (2, 4, 8) and weights.shape == (2, 2, 4, 4)
    out, weights = Encoder(**BLOCK, num_layers=3, return_attention_scores=True)(X)
    assert [w.shape for w in weights] == [(2, 2, 4, 4)] * 3
    out, weights = DecoderLayer(**BLOCK, return_attention_scores=True)(X, MEM)
    assert weights["self"].shape == (2, 2, 4, 4) and weights["cross"].shape == (2, 2, 4, 5)


@pytest.mark.parametrize("scores", [False, True])
def test_cached_decoder_equals_full_decoder_and_keeps_the_scores(scores):
    decoder = Decoder(**BLOCK, **UNEVEN, num_layers=2, return_attention_scores=scores)
    full = decoder(X, MEM, self_attention_mask=CAUSAL, memory_mask=MEM_MASK)
    full = full[0] if scores else full
    cache = {
        f"layer_{i}": {"k": tf.zeros([2, 2, 0, 3]), "v": tf.zeros([2, 2, 0, 5])} for i in range(2)
    }  # grows by one position per step
    projected = decoder.project_memory(MEM)
    for t in range(4):
        outputs = decoder(
            X[:, t : t + 1], memory_mask=MEM_MASK, projected_memory=projected, cache=cache, step=t
        )
        assert len(outputs) == 2 + scores  # (outputs, cache[, weights]): nothing dropped
        out, cache = outputs[:2]
        if scores:
            assert outputs[2]["self"][0].shape == (2, 2, 1, t + 1)  # the positions so far
            assert outputs[2]["cross"][1].shape == (2, 2, 1, 5)
        np.testing.assert_allclose(out[:, 0], full[:, t], rtol=1e-5, atol=1e-5)


def test_encoder_ignores_padded_positions():
    ids = tf.constant([[3, 4, 5, 0], [6, 7, 8, 9]])
    encoder = Encoder(**BLOCK, num_layers=2)
    mask = masks.key_padding_mask(ids)
    out = encoder(X, attention_mask=mask).numpy()
    noisy = X.copy()
    noisy[0, 3] += 100.0  # change the content at a padded position
    out2 = encoder(noisy, attention_mask=mask).numpy()
    np.testing.assert_allclose(out2[0, :3], out[0, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out2[0, 3], out[0, 3])  # the padded position itself did change


def test_decoder_is_causal():
    decoder = Decoder(**BLOCK, num_layers=2)
    out = decoder(X, MEM, self_attention_mask=CAUSAL).numpy()
    later = X.copy()
    later[:, 2:] = RNG.normal(size=later[:, 2:].shape)
    out2 = decoder(later, MEM, self_attention_mask=CAUSAL).numpy()
    np.testing.assert_allclose(out2[:, :2], out[:, :2], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out2[:, 2:], out[:, 2:])


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of num_heads"):
        EncoderLayer(d_model=9, num_heads=2, d_ff=16)
    with pytest.raises(ValueError, match="d_v must be a positive integer"):
        DecoderLayer(**BLOCK, d_v=0)
    with pytest.raises(ValueError, match="num_layers"):
        Encoder(**BLOCK, num_layers=0)
