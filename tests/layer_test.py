"""One shared helper that every public layer passes (after keras-hub's run_layer_test and its
TestCase's run_serialization_test / run_precision_test)."""

from __future__ import annotations

import json
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")

# a dict of __init__ arguments, or a function dtype -> dict (for layers that take a layer)
InitKwargs = dict | Callable[[str | None], dict]


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _kwargs(init_kwargs: InitKwargs, dtype: str | None = None) -> dict:
    kwargs = init_kwargs(dtype) if callable(init_kwargs) else dict(init_kwargs)
    return kwargs if dtype is None else {**kwargs, "dtype": dtype}


def _as_config_value(value):
    if isinstance(value, keras.layers.Layer):
        return keras.saving.serialize_keras_object(value)
    return value


def run_serialization_test(layer_cls, init_kwargs: InitKwargs):
    """from_config(get_config()) and a serialize -> JSON -> deserialize round trip give the
    same config; every __init__ argument is in the config. The JSON round trip goes through
    the registry, so it fails on a class without `register_keras_serializable`."""
    kwargs = _kwargs(init_kwargs)
    layer = layer_cls(**kwargs)
    config = layer.get_config()
    for key, value in kwargs.items():
        assert config[key] == _as_config_value(value), f"get_config lost {key!r}"
    clone = layer_cls.from_config(config)
    assert clone.get_config() == config
    serialized = json.loads(json.dumps(keras.saving.serialize_keras_object(layer)))
    revived = keras.saving.deserialize_keras_object(serialized)
    assert type(revived) is layer_cls, f"deserialized a {type(revived).__name__}"
    assert revived.get_config() == config
    return layer, clone


def run_precision_test(layer_cls, init_kwargs: InitKwargs, args, call_kwargs):
    """Under each mixed policy: every sublayer computes in the policy's dtype and keeps
    float32 variables, every weight is float32, the output is in the compute dtype, finite."""
    for policy_name in MIXED_POLICIES:
        policy = keras.DTypePolicy(policy_name)
        layer = layer_cls(**_kwargs(init_kwargs, policy_name))
        out = _first(layer(*args, **call_kwargs))
        # keras-hub walks sublayers the same way (Layer._flatten_layers)
        for sublayer in layer._flatten_layers(include_self=True, recursive=True):
            assert sublayer.compute_dtype == policy.compute_dtype, (
                f"{policy_name}: {sublayer.name} computes in {sublayer.compute_dtype}"
            )
            assert sublayer.variable_dtype == "float32", (
                f"{policy_name}: {sublayer.name} keeps {sublayer.variable_dtype} variables"
            )
        for weight in layer.weights:
            assert weight.dtype == "float32", f"{weight.path} is {weight.dtype} under {policy}"
        assert out.dtype == policy.compute_dtype, f"{policy_name}: output {out.dtype}"
        assert np.all(np.isfinite(tf.cast(out, tf.float32).numpy()))


def _run_fit_step(layer_cls, init_kwargs, args, call_kwargs, expected_output_shape, trainable):
    """Symbolic call in a functional model, then one fit step that changes a weight."""
    inputs = [
        keras.Input(shape=np.shape(a)[1:], dtype=tf.as_dtype(np.asarray(a).dtype).name)
        for a in args
    ]
    symbolic = _first(layer_cls(**_kwargs(init_kwargs))(*inputs, **call_kwargs))
    assert tuple(symbolic.shape[1:]) == tuple(expected_output_shape[1:])
    model = keras.Model(inputs, symbolic)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.numpy().copy() for w in model.trainable_weights]
    target = np.ones(expected_output_shape, np.float32)
    history = model.fit(list(args), target, batch_size=len(args[0]), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    if trainable:
        changed = [not np.allclose(b, w.numpy()) for b, w in zip(before, model.trainable_weights)]
        assert any(changed), "a fit step changed no weight"


def run_layer_test(
    layer_cls,
    init_kwargs: InitKwargs,
    args: tuple,
    *,
    call_kwargs: dict | None = None,
    expected_output_shape: tuple,
    expected_num_trainable_weights: int,
    expected_num_non_trainable_weights: int = 0,
):
    """Config and JSON round trips, weights after build, eager and symbolic calls, one fit
    step, and both mixed-precision policies down to every sublayer."""
    call_kwargs = call_kwargs or {}
    layer, clone = run_serialization_test(layer_cls, init_kwargs)

    # weights exist right after build()
    input_shape = tuple(np.shape(args[0]))
    layer.build(input_shape)
    assert len(layer.trainable_weights) == expected_num_trainable_weights
    assert len(layer.non_trainable_weights) == expected_num_non_trainable_weights

    # eager call
    output = _first(layer(*args, **call_kwargs))
    assert tuple(output.shape) == tuple(expected_output_shape)
    assert np.all(np.isfinite(np.asarray(output, np.float32)))

    # the clone computes the same function once given the same weights
    clone.build(input_shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(_first(clone(*args, **call_kwargs)), output, atol=1e-6)

    _run_fit_step(
        layer_cls,
        init_kwargs,
        args,
        call_kwargs,
        expected_output_shape,
        trainable=expected_num_trainable_weights > 0,
    )
    run_precision_test(layer_cls, init_kwargs, args, call_kwargs)
    return layer
