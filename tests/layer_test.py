"""One shared helper that every public layer passes (after keras-hub's run_layer_test)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def run_layer_test(
    layer_cls,
    init_kwargs: dict,
    args: tuple,
    *,
    call_kwargs: dict | None = None,
    expected_output_shape: tuple,
    expected_num_trainable_weights: int,
    expected_num_non_trainable_weights: int = 0,
):
    """Config round trip, weights after build, eager and symbolic calls, one fit step,
    and every mixed-precision policy (float32 variables, outputs in the compute dtype)."""
    call_kwargs = call_kwargs or {}

    # config round trip: from_config(get_config()) has the same config, and every
    # __init__ keyword argument is in the config
    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    for key, value in init_kwargs.items():
        assert config[key] == value, f"get_config lost {key!r}"
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config

    # weights exist right after build()
    layer.build()
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    # eager call
    output = _first(layer(*args, **call_kwargs))
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert np.all(np.isfinite(np.asarray(output, np.float32)))

    # the clone computes the same function once given the same weights
    clone.build()
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_first(clone(*args, **call_kwargs)), output, atol=1e-6)

    # symbolic call and one fit step in a functional model
    inputs = [
        keras.Input(shape=np.shape(a)[1:], dtype=tf.as_dtype(np.asarray(a).dtype).name)
        for a in args
    ]
    symbolic = _first(layer_cls(**init_kwargs)(*inputs, **call_kwargs))
    assert tuple(symbolic.shape[1:]) == tuple(expected_output_shape[1:])
    model = keras.Model(inputs, symbolic)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.numpy().copy() for w in model.trainable_weights]
    target = np.ones(expected_output_shape, np.float32)
    history = model.fit(list(args), target, batch_size=len(args[0]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    if expected_num_trainable_weights:
        changed = [not np.allclose(b, w.numpy()) for b, w in zip(before, model.trainable_weights)]
        assert any(changed), "a fit step changed no weight"

    # mixed precision: float32 variables, compute-dtype outputs, finite values
    for policy in POLICIES:
        mixed = layer_cls(**init_kwargs, dtype=policy)
        out = _first(mixed(*args, **call_kwargs))
        for weight in mixed.weights:
            assert weight.dtype == "float32", f"{weight.path} is {weight.dtype} under {policy}"
        assert out.dtype == mixed.compute_dtype, f"{policy}: output {out.dtype}"
        assert np.all(np.isfinite(tf.cast(out, tf.float32).numpy()))
    return layer
