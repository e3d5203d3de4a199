import keras
import numpy as np
import tensorflow as tf

from keras_transformer.layers.projection import add_projection, project

X = np.random.default_rng(6).normal(size=(2, 3, 4)).astype(np.float32)


def test_project_is_one_matmul_over_all_positions():
    layer = keras.layers.Layer()
    kernel, bias = add_projection(layer, "out", (4, 5))
    bias.assign(np.arange(5, dtype=np.float32))
    out = project(X, kernel, bias).numpy()
    assert out.shape == (6, 5)  # (B*T, width_out)
    # float32 to its rounding: numpy's and TensorFlow's matmul may add in another order
    # (without oneDNN, on an AMD EPYC: 2.4e-7 apart)
    expected = X.reshape(6, 4) @ kernel.numpy()
    np.testing.assert_allclose(out, expected + np.arange(5), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(project(X, kernel).numpy(), expected, rtol=1e-6, atol=1e-6)


def test_projection_weights_are_named_and_ordered_for_checkpoints():
    layer = keras.layers.Layer()
    add_projection(layer, "inner", (4, 5))
    add_projection(layer, "qkv", (4, 6), use_bias=False)
    assert [(w.name, tuple(w.shape)) for w in layer.weights] == [
        ("inner_kernel", (4, 5)),
        ("inner_bias", (5,)),
        ("qkv_kernel", (4, 6)),
    ]
    np.testing.assert_array_equal(layer.weights[1].numpy(), 0.0)


def test_project_computes_in_the_inputs_dtype():
    layer = keras.layers.Layer()
    kernel, bias = add_projection(layer, "out", (4, 5))
    out = project(tf.constant(X, tf.bfloat16), kernel, bias)
    assert out.dtype == tf.bfloat16 and kernel.dtype == "float32"
