"""The encoder-decoder Transformer as a `keras.Model`, with the pieces decoding needs."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.layers import (
    Decoder,
    Encoder,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    SharedEmbedding,
    masks,
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Vaswani et al. (2017): shared embeddings, N encoder and N decoder layers.

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
    for any Keras model; `train.py` wraps the model in `training.TrainingModel`, which
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
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            dtype=self.dtype_policy,
            name="embedding",
        )
        if config.positional == "learned":
            self.positional = LearnedPositionalEmbedding(
                max_length=config.max_length,
                d_model=config.d_model,
                dtype=self.dtype_policy,
                name="positional",
            )
        else:
            self.positional = PositionalEncoding(
                d_model=config.d_model, dtype=self.dtype_policy, name="positional"
            )
        self.embedding_dropout = keras.layers.Dropout(
            config.dropout_rate, dtype=self.dtype_policy, name="embedding_dropout"
        )
        # the stacks return their attention weights too (the softmax computes them anyway):
        # encode/decode keep the outputs, attention_weights keeps the weights
        stack_kwargs = dict(
            **config.layer_kwargs(), return_attention_scores=True, dtype=self.dtype_policy
        )
        self.encoder = Encoder(**stack_kwargs, name="encoder")
        self.decoder = Decoder(**stack_kwargs, name="decoder")

    def build(self, input_shape=None):
        if self.built:  # a later build() is a no-op
            return
        for layer in (self.embedding, self.positional, self.encoder, self.decoder):
            layer.build()
        self.built = True

    # -- the pieces ------------------------------------------------------------------------

    def _embed(self, ids, offset=0, training=None):
        x = self.positional(self.embedding(ids), offset=offset)
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
            self._embed(target_in_ids, training=training),
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

    # -- incremental decoding --------------------------------------------------------------

    def init_cache(self, memory, source_ids, max_length):
        """Decoder state for `decode_step`.

        Returns a nested dict: "decoder": {"layer_i": {"k", "v"}} self-attention keys and
        values of shape (B, h, t, d_k / d_v), empty (t = 0) here and one position longer
        after every `decode_step`; "static": {"memory_mask": (B, 1, 1, S) bool, "cross":
        {"layer_i": {"k", "v"}}} computed once. Beam search reorders "decoder" and never
        needs to reorder "static". `max_length` is accepted for compatibility: the cache
        grows with the output instead of being allocated for the longest one.
        """
        del max_length  # the cache grows one position per step
        cfg = self.config
        batch = tf.shape(memory)[0]
        d_k, d_v = self.decoder.d_k, self.decoder.d_v

        def slots(depth):
            return tf.zeros([batch, cfg.num_heads, 0, depth], self.compute_dtype)

        return {
            "decoder": {
                f"layer_{i}": {"k": slots(d_k), "v": slots(d_v)} for i in range(cfg.num_layers)
            },
            "static": {
                "memory_mask": masks.key_padding_mask(tf.convert_to_tensor(source_ids, tf.int32)),
                "cross": self.decoder.project_memory(memory),
            },
        }

    def decode_step(self, ids_t, step, cache):
        """ids_t (B,) int32 at position `step` -> (logits (B, V) float32, updated cache)."""
        x = self._embed(tf.convert_to_tensor(ids_t, tf.int32)[:, tf.newaxis], offset=step)
        x, decoder_cache, _ = self.decoder(
            x,
            memory_mask=cache["static"]["memory_mask"],
            projected_memory=cache["static"]["cross"],
            cache=cache["decoder"],
            step=step,
        )
        logits = self.embedding.logits(x)[:, 0, :]
        return logits, {"decoder": decoder_cache, "static": cache["static"]}

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
