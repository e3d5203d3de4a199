"""The residual + dropout + layer-norm wrapper, written once (paper section 5.4)."""

from __future__ import annotations

import keras


def make_norm_and_dropout(owner: keras.layers.Layer, name: str, d_model: int):
    """A built LayerNormalization and a Dropout with the owner's policy and settings."""
    norm = keras.layers.LayerNormalization(
        epsilon=owner.layer_norm_epsilon, dtype=owner.dtype_policy, name=f"{name}_norm"
    )
    norm.build((None, None, d_model))
    dropout = keras.layers.Dropout(
        owner.dropout_rate, dtype=owner.dtype_policy, name=f"{name}_dropout"
    )
    return norm, dropout


def residual(x, sublayer, norm, dropout, *, norm_first: bool, training):
    """Post-norm LayerNorm(x + Dropout(f(x))), or pre-norm x + Dropout(f(LayerNorm(x))).

    `sublayer(y)` returns `(out, extra)` so that caches or attention weights pass through.
    """
    if norm_first:
        out, extra = sublayer(norm(x))
        return x + dropout(out, training=training), extra
    out, extra = sublayer(x)
    return norm(x + dropout(out, training=training)), extra
