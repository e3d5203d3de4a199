"""The paper's formulas in plain numpy, computed from a layer's own weights, head by head.

What the fused, reshaped TensorFlow layers must equal (inference mode: no dropout).
Masks are boolean numpy arrays broadcastable to (B, T, S), True where attention is allowed.
"""

from __future__ import annotations

import numpy as np


def randomize(layer, seed=0):
    """Random values for every weight (gamma, beta and biases too), so that a reference
    that forgot one of them cannot agree by accident."""
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(scale=0.3, size=w.shape) for w in layer.get_weights()])


def layer_norm(x, norm):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * norm.gamma.numpy() + norm.beta.numpy()


def softmax(scores):
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _split(kernel, bias, widths):
    cuts = np.cumsum(widths)[:-1]
    return zip(np.split(kernel.numpy(), cuts, axis=1), np.split(bias.numpy(), cuts))


def multi_head_attention(mha, query, memory=None, mask=None):
    """Concat(head_1..head_h) W^O, head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V."""
    h, d_k, d_v = mha.num_heads, mha.d_k, mha.d_v
    if mha.self_attention:
        memory = query
        (wq, bq), (wk, bk), (wv, bv) = _split(
            mha.qkv_kernel, mha.qkv_bias, [h * d_k] * 2 + [h * d_v]
        )
    else:
        ((wq, bq),) = _split(mha.q_kernel, mha.q_bias, [h * d_k])
        (wk, bk), (wv, bv) = _split(mha.kv_kernel, mha.kv_bias, [h * d_k, h * d_v])
    heads = []
    for i in range(h):
        qi, vi = slice(i * d_k, (i + 1) * d_k), slice(i * d_v, (i + 1) * d_v)
        q = query @ wq[:, qi] + bq[qi]  # (B, T, d_k)
        k = memory @ wk[:, qi] + bk[qi]  # (B, S, d_k)
        v = memory @ wv[:, vi] + bv[vi]  # (B, S, d_v)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d_k)  # (B, T, S)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        heads.append(softmax(scores) @ v)
    return np.concatenate(heads, -1) @ mha.output_kernel.numpy() + mha.output_bias.numpy()


def feed_forward(ffn, x):
    """max(0, x W1 + b1) W2 + b2."""
    hidden = np.maximum(0.0, x @ ffn.inner_kernel.numpy() + ffn.inner_bias.numpy())
    return hidden @ ffn.output_kernel.numpy() + ffn.output_bias.numpy()


def residual(block, x, sublayer):
    """Post-norm LayerNorm(x + Sublayer(x)); pre-norm x + Sublayer(LayerNorm(x))."""
    if block.norm_first:
        return x + sublayer(layer_norm(x, block.norm))
    return layer_norm(x + sublayer(x), block.norm)


def encoder_layer(layer, x, mask=None):
    attention = layer.self_attention
    x = residual(attention, x, lambda y: multi_head_attention(attention.sublayer, y, mask=mask))
    return residual(layer.feed_forward, x, lambda y: feed_forward(layer.feed_forward.sublayer, y))


def decoder_layer(layer, x, memory, causal=None, memory_mask=None):
    self_att, cross = layer.self_attention, layer.cross_attention
    x = residual(self_att, x, lambda y: multi_head_attention(self_att.sublayer, y, mask=causal))
    x = residual(
        cross, x, lambda y: multi_head_attention(cross.sublayer, y, memory, mask=memory_mask)
    )
    return residual(layer.feed_forward, x, lambda y: feed_forward(layer.feed_forward.sublayer, y))


def stack(layer, x, block_fn):
    for block in layer.blocks:
        x = block_fn(block, x)
    return x if layer.final_norm is None else layer_norm(x, layer.final_norm)
