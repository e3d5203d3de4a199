"""The encoder-decoder Transformer as a `keras.Model`, with the pieces decoding needs."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.config import BOS_ID, TransformerConfig
from keras_transformer.layers import (
    Decoder,
    Dropout,
    Encoder,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    SharedEmbedding,
    masks,
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Vaswani et al. (2017): shared embeddings, N encoder and N decoder layers.

    The config's named deviations (a decoder depth of its own, the feed-forward activation,
    an output bias, the sinusoid layout, a zero decoder start) are those of Marian's
    Transformer, so that OPUS-MT models import (`keras_transformer.importers.marian`).

    Args:
        config: a `TransformerConfig` (or its dict).

    Call arguments:
        inputs: `(source_ids (B, S), target_in_ids (B, T))`, int32, pad 0.
        training: dropout on or off.

    Returns:
        (B, T, V) float32 logits, whatever the dtype policy.

    Example:
        >>> cfg = TransformerConfig.preset("tiny", vocab_size=100)
        >>> model = Transformer(cfg)
        >>> model((tf.ones([2, 5], tf.int32), tf.ones([2, 4], tf.int32))).shape
        TensorShape([2, 4, 100])

    Training: `compile(loss=LabelSmoothedCrossEntropy(), ...)` and Keras' own `fit` work as
    for any Keras model; `kt-train` wraps the model in `training.TrainingModel`, which
    normalizes the loss by the real tokens of the global batch and accumulates gradients.
    """

    def __init__(self, config: TransformerConfig | dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if config is None:
            config = TransformerConfig()
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        self.embedding = SharedEmbedding(
            **config.layer_kwargs("embedding"), dtype=self.dtype_policy, name="embedding"
        )
        positional_class = (
            LearnedPositionalEmbedding if config.positional == "learned" else PositionalEncoding
        )
        self.positional = positional_class(
            **config.layer_kwargs("positional"), dtype=self.dtype_policy, name="positional"
        )
        self.embedding_dropout = Dropout(
            config.dropout_rate, dtype=self.dtype_policy, name="embedding_dropout"
        )
        # the stacks return their attention weights too (the softmax computes them anyway):
        # encode/decode keep the outputs, attention_weights keeps the weights
        stack_kwargs = dict(return_attention_scores=True, dtype=self.dtype_policy)
        self.encoder = Encoder(**config.layer_kwargs("encoder"), **stack_kwargs, name="encoder")
        self.decoder = Decoder(**config.layer_kwargs("decoder"), **stack_kwargs, name="decoder")

    def build(self, input_shape=None):
        if self.built:  # a later build() is a no-op
            return
        for layer in (self.embedding, self.positional, self.encoder, self.decoder):
            layer.build()
        self.built = True

    # -- the pieces ------------------------------------------------------------------------

    def _embed(self, ids, offset=0, training=None, decoder=False):
        x = self.embedding(ids)
        if decoder and self.config.decoder_start_zero:  # the bos position: a zero embedding
            x = x * tf.cast(tf.not_equal(ids, BOS_ID), x.dtype)[..., tf.newaxis]
        x = self.positional(x, offset=offset)
        return self.embedding_dropout(x, training=training)

    def encode(self, source_ids, training=False):
        """(B, S) ids -> memory (B, S, d_model)."""
        memory, _ = self._encode(source_ids, training=training)
        return memory

    def decode(self, target_in_ids, memory, source_ids, training=False):
        """(B, T) ids, memory (B, S, d_model), (B, S) source ids for the pad mask -> (B, T, V)."""
        x, _ = self._decode(target_in_ids, memory, source_ids, training=training)
        return self.embedding.logits(x)

    def _encode(self, source_ids, training=False):
        """-> (memory (B, S, d_model), [N self-attention weights])."""
        source_ids = tf.convert_to_tensor(source_ids, tf.int32)
        return self.encoder(
            self._embed(source_ids, training=training),
            attention_mask=masks.key_padding_mask(source_ids),
            training=training,
        )

    def _decode(self, target_in_ids, memory, source_ids, training=False):
        """-> (decoder output (B, T, d_model), {"self": [...], "cross": [...]} weights)."""
        target_in_ids = tf.convert_to_tensor(target_in_ids, tf.int32)
        return self.decoder(
            self._embed(target_in_ids, training=training, decoder=True),
            memory,
            self_attention_mask=masks.causal_mask(tf.shape(target_in_ids)[1]),
            memory_mask=masks.key_padding_mask(tf.convert_to_tensor(source_ids, tf.int32)),
            training=training,
        )

    def call(self, inputs, training=None):
        source_ids, target_in_ids = inputs
        memory = self.encode(source_ids, training=training)
        return self.decode(target_in_ids, memory, source_ids, training=training)

    def attention_weights(self, source_ids, target_in_ids):
        """Inference-mode attention maps: {"encoder": [(B, h, S, S)] per layer,
        "decoder_self": [(B, h, T, T)], "cross": [(B, h, T, S)]} (float32)."""
        memory, encoder_weights = self._encode(source_ids)
        _, decoder_weights = self._decode(target_in_ids, memory, source_ids)
        return {
            "encoder": encoder_weights,
            "decoder_self": decoder_weights["self"],
            "cross": decoder_weights["cross"],
        }

    def forced_decode(self, source_ids, target_in_ids):
        """One inference-mode pass over given targets: (logits (B, T, V) float32, the
        cross-attention weights of every decoder layer [(B, h, T, S)])."""
        memory, _ = self._encode(source_ids)
        x, weights = self._decode(target_in_ids, memory, source_ids)
        return tf.cast(self.embedding.logits(x), tf.float32), weights["cross"]

    # -- incremental decoding --------------------------------------------------------------

    def init_cache(self, memory, source_ids, fixed_capacity=False):
        """Decoder state for `decode_step`, for the B sentences of `memory`.

        Returns a nested dict:
          - "rows": {"slots": (B, 0) int32}, one row per decoded hypothesis: `slots[n, tau]`
            is which of its sentence's rows wrote, at step tau, the key that hypothesis n
            attends to (beam search reorders these rows, a few bytes each);
          - "sentence": one row per sentence, shared by its beams and never reordered:
            "memory_mask" (B, 1, 1, S) bool; "cross": {"layer_i": {"k", "v"}} computed once;
            "self": {"layer_i": {"k", "v", "recent_k", "recent_v"}} self-attention keys and
            values (B, h, t G, d_k / d_v) in two blocks (see `MultiHeadAttention`), empty
            here and G positions longer (one per row) after every step;
          - "constant": {"output_kernel": (d_model, V)}, the transposed embedding matrix,
            made once instead of at every step.
        The self-attention cache grows with the output (one position per step) instead of
        being allocated for the longest one.

        With `fixed_capacity` (for XLA, whose loops need static shapes), the cache has room
        for a fixed number of steps C instead, 0 here (`grow_cache` makes room): "slots"
        (N, C) holds -1 where no step has been written yet, and each layer's "self" entry is
        {"buffer_k", "buffer_v"} (B, h, C G, d_k / d_v) (see attention_cache.py). The
        outputs equal those of the growing cache (the positions not written are masked).
        """
        batch = tf.shape(memory)[0]
        return {
            "rows": {"slots": tf.zeros([batch, 0], tf.int32)},
            "sentence": {
                "memory_mask": masks.key_padding_mask(tf.convert_to_tensor(source_ids, tf.int32)),
                "cross": self.decoder.project_memory(memory),
                "self": self._empty_self_cache(batch, fixed_capacity),
            },
            "constant": {"output_kernel": self.embedding.output_kernel()},
        }

    def _empty_self_cache(self, batch, fixed_capacity):
        """`init_cache`'s "self" entry: every decoder layer's empty self-attention keys and
        values, (B, h, 0, d_k / d_v) each."""
        d_k, d_v = self.decoder.d_k, self.decoder.d_v

        def empty(depth):
            return tf.zeros([batch, self.config.num_heads, 0, depth], self.compute_dtype)

        return {
            f"layer_{i}": (
                {"buffer_k": empty(d_k), "buffer_v": empty(d_v)}
                if fixed_capacity
                else {
                    "k": empty(d_k),
                    "v": empty(d_v),
                    "recent_k": empty(d_k),
                    "recent_v": empty(d_v),
                }
            )
            for i in range(self.config.num_decoder_layers)
        }

    def grow_cache(self, cache, capacity):
        """A fixed-capacity cache (`init_cache(..., fixed_capacity=True)`) with room for
        `capacity` steps (scalar int, >= its current capacity): the steps written so far
        keep their positions, the new ones are empty."""
        slots = cache["rows"]["slots"]
        sentence = cache["sentence"]
        group = tf.shape(slots)[0] // tf.shape(sentence["memory_mask"])[0]
        more = capacity - tf.shape(slots)[1]
        slots = tf.pad(slots, [[0, 0], [0, more]], constant_values=-1)
        grown = tf.nest.map_structure(
            lambda t: tf.pad(t, [[0, 0], [0, 0], [0, more * group], [0, 0]]), sentence["self"]
        )
        return {**cache, "rows": {"slots": slots}, "sentence": {**sentence, "self": grown}}

    def decode_step(self, ids_t, step, cache):
        """ids_t (N,) int32 at position `step` -> (logits (N, V) float32, updated cache).

        N is the cache's B sentences times G rows each (G consecutive rows per sentence:
        beam search's beams; G = 1 for one hypothesis per sentence). Each row attends to
        the keys of its own history (`cache["rows"]["slots"]`), so beam search reorders
        only "rows" and never copies the keys and values. With a fixed-capacity cache
        (`init_cache(..., fixed_capacity=True)`), `step` must be below its capacity.
        """
        ids_t = tf.convert_to_tensor(ids_t, tf.int32)
        sentence = cache["sentence"]
        sentences = tf.shape(sentence["memory_mask"])[0]
        rows = tf.shape(ids_t)[0]
        slot = tf.range(rows) % (rows // sentences)  # the position of each row in its group
        slots = cache["rows"]["slots"]
        if _fixed_capacity(sentence["self"]):  # write the step's column
            column = tf.equal(tf.range(tf.shape(slots)[1]), step)[tf.newaxis, :]
            slots = tf.where(column, slot[:, tf.newaxis], slots)
        else:
            slots = tf.concat([slots, slot[:, tf.newaxis]], axis=1)
        x = self._embed(ids_t[:, tf.newaxis], offset=step, decoder=True)
        x, self_cache, _ = self.decoder(
            x,
            self_attention_mask=masks.history_mask(slots, sentences),
            memory_mask=sentence["memory_mask"],
            projected_memory=sentence["cross"],
            cache=sentence["self"],
            step=step,
        )
        kernel = cache.get("constant", {}).get("output_kernel")
        logits = self.embedding.logits(x, kernel=kernel)[:, 0, :]
        return logits, {
            **cache,
            "rows": {"slots": slots},
            "sentence": {**sentence, "self": self_cache},
        }

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _fixed_capacity(self_cache) -> bool:
    """Whether a decoder self-attention cache is the fixed-capacity one."""
    return any("buffer_k" in layer for layer in self_cache.values())
