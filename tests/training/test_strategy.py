import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.training.strategy import StrategyError, make_strategy, set_precision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_mirrored_on_two_cpus_equals_one_device():
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "replica_equivalence.py")],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert result["max_update"] > 1e-3  # the step really changed the weights
    assert result["loss_two"] == pytest.approx(result["loss_one"], abs=1e-5)
    assert result["max_weight_diff"] < 1e-5


def micro_model(seed_weights=None):
    cfg = kt.TransformerConfig.preset("tiny", vocab_size=50, dropout_rate=0.0)
    model = kt.Transformer(cfg)
    model.build()
    if seed_weights is not None:
        model.set_weights(seed_weights)
    return model


def test_gradient_accumulation_equals_one_large_batch():
    rng = np.random.default_rng(1)
    src = rng.integers(4, 50, size=(6, 8)).astype("int32")
    tgt = rng.integers(4, 50, size=(6, 6)).astype("int32")
    for row, n in enumerate([6, 5, 2, 6, 1, 3]):
        tgt[row, n:] = 0
    data = tf.data.Dataset.from_tensors(((src, tgt), tgt))
    start = micro_model().get_weights()
    results = []
    for k in (1, 3):
        model = micro_model(start)
        # plain SGD compares the summed gradients themselves (Adam's first step is ~sign(g),
        # which amplifies float noise on near-zero gradients)
        model.compile(
            optimizer=keras.optimizers.SGD(1.0), loss=kt.LabelSmoothedCrossEntropy(), accum_steps=k
        )
        loss = model.fit(data, epochs=1, verbose=0).history["loss"][0]
        results.append((loss, model.get_weights()))
    (loss1, w1), (loss3, w3) = results
    assert loss3 == pytest.approx(loss1, abs=1e-5)
    assert max(np.max(np.abs(a - b)) for a, b in zip(w1, w3)) < 1e-5
    assert max(np.max(np.abs(a - b)) for a, b in zip(w1, start)) > 1e-4


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training(policy):
    set_precision(policy)
    model = micro_model()
    model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
    rng = np.random.default_rng(2)
    src = rng.integers(4, 50, size=(4, 8)).astype("int32")
    tgt = rng.integers(4, 50, size=(4, 6)).astype("int32")
    src[3] = 0  # a fully padded source row
    history = model.fit(
        tf.data.Dataset.from_tensors(((src, tgt), tgt)).repeat(4), epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
    assert all(w.dtype == "float32" for w in model.weights)
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    if scaled:
        assert float(model.optimizer.dynamic_scale.numpy()) > 1.0


def test_bad_strategy_settings():
    with pytest.raises(StrategyError, match="unknown --strategy"):
        make_strategy("ring")
    with pytest.raises(StrategyError, match="unknown --precision"):
        set_precision("float8")
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    os.environ.pop("TF_CONFIG", None)
    with pytest.raises(StrategyError, match="TF_CONFIG"):
        make_strategy("multi_worker")
    os.environ.update(env)
