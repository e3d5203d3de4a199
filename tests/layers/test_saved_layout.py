"""Configs and checkpoints saved before the #22 cleanups (commit e359368: attention.py in one
file, the projections written twice, the hand-written MaskedAccuracy) still load.

saved_layout.json was written by that commit's code from the objects below:
{"configs": {name: keras.saving.serialize_keras_object(obj)}, "checkpoint":
[[variable name, shape] of tf.train.list_variables(a tf.train.Checkpoint(model=tiny))]}.
"""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import layers as L

SAVED = os.path.join(os.path.dirname(__file__), "saved_layout.json")
BLOCK = {"d_model": 8, "num_heads": 2, "d_ff": 16, "dropout_rate": 0.1}


def objects():
    """One of each public layer, the loss and the metric, named (auto names count up)."""
    ffn = L.PositionwiseFeedForward(d_model=8, d_ff=16, ffn_dropout=0.1, name="sublayer")
    cross = {"self_attention": False, "use_bias": False, "return_attention_scores": True}
    return {
        "ScaledDotProductAttention": L.ScaledDotProductAttention(
            attention_dropout=0.1, name="attention"
        ),
        "MultiHeadAttention/self": L.MultiHeadAttention(num_heads=2, d_model=8, name="self"),
        "MultiHeadAttention/cross": L.MultiHeadAttention(
            num_heads=3, d_model=12, d_k=2, d_v=5, **cross, name="cross"
        ),
        "PositionwiseFeedForward": ffn,
        "Residual": L.Residual(ffn, dropout_rate=0.2, norm_first=True, name="feed_forward"),
        "EncoderLayer": L.EncoderLayer(**BLOCK, name="encoder_layer"),
        "DecoderLayer": L.DecoderLayer(**BLOCK, d_k=3, d_v=5, norm_first=True, name="dec_layer"),
        "Encoder": L.Encoder(**BLOCK, num_layers=2, return_attention_scores=True, name="enc"),
        "Decoder": L.Decoder(**BLOCK, num_layers=2, norm_first=True, name="dec"),
        "SharedEmbedding": L.SharedEmbedding(vocab_size=40, d_model=8, name="embedding"),
        "PositionalEncoding": L.PositionalEncoding(d_model=8, name="positions"),
        "LearnedPositionalEmbedding": L.LearnedPositionalEmbedding(
            max_length=16, d_model=8, name="learned_positions"
        ),
        "LabelSmoothedCrossEntropy": kt.LabelSmoothedCrossEntropy(0.2),
        "MaskedAccuracy": kt.MaskedAccuracy(),
    }


def without_modules(config):
    """A serialized config without its "module" entries (where a class lives may move)."""
    if isinstance(config, dict):
        return {k: without_modules(v) for k, v in config.items() if k != "module"}
    if isinstance(config, list):
        return [without_modules(v) for v in config]
    return config


def saved():
    with open(SAVED) as f:
        return json.load(f)


def test_saved_configs_deserialize_to_the_same_classes_and_configs():
    saved_configs = saved()["configs"]
    current = objects()
    assert sorted(saved_configs) == sorted(current)
    for name, config in saved_configs.items():
        revived = keras.saving.deserialize_keras_object(config)
        assert type(revived) is type(current[name]), name
        assert revived.get_config() == current[name].get_config(), name
        serialized = keras.saving.serialize_keras_object(current[name])
        assert without_modules(serialized) == without_modules(config), name


def test_checkpoint_layout_is_unchanged(tmp_path):
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=40))
    model.build()
    path = tf.train.Checkpoint(model=model).save(os.path.join(tmp_path, "ckpt"))
    layout = [[n, s] for n, s in tf.train.list_variables(path) if n.startswith("model/")]
    assert layout == saved()["checkpoint"]
