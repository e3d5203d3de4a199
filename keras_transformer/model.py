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
from keras_transformer.losses import LabelSmoothedCrossEntropy


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

    Training with `fit`: compile with `LabelSmoothedCrossEntropy`; `train_step` divides the
    token-loss sum by the real tokens of the global batch (all replicas) and, with
    `compile(..., accum_steps=k)`, splits every batch into k micro-batches whose gradients
    are summed before one update.
    """

    def __init__(self, config: TransformerConfig | dict | None = None, **kwargs):
        super().__init__(**kwargs)
        if config is None:
            config = TransformerConfig()
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        self.accum_steps = 1
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
        if self.built:  # compile() builds; a later build() is a no-op
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

    # -- training --------------------------------------------------------------------------

    def compile(self, *args, accum_steps: int = 1, **kwargs):
        """`keras.Model.compile`, plus `accum_steps` micro-batches per update (default 1)."""
        if not isinstance(accum_steps, int) or accum_steps < 1:
            raise ValueError(f"accum_steps must be a positive integer, got {accum_steps!r}")
        self.accum_steps = accum_steps
        if not self.built:
            self.build()  # so that fit() creates the optimizer variables outside the step
        super().compile(*args, **kwargs)

    def get_compile_config(self):
        config = super().get_compile_config()
        if config is not None:
            config = {**config, "accum_steps": self.accum_steps}
        return config

    def compile_from_config(self, config):
        from keras.saving import deserialize_keras_object

        self.compile(**deserialize_keras_object(config))  # accum_steps travels in the config
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def _token_loss(self):
        if not isinstance(self.loss, LabelSmoothedCrossEntropy):
            raise ValueError(
                "Transformer.fit needs compile(loss=keras_transformer.LabelSmoothedCrossEntropy(...)), "
                f"got {self.loss!r}"
            )
        return self.loss

    def train_step(self, data):
        (source_ids, target_in_ids), target_out_ids = data[:2] if isinstance(data, tuple) else data
        loss_fn = self._token_loss()
        local_tokens = tf.reduce_sum(tf.cast(tf.not_equal(target_out_ids, 0), tf.float32))
        global_tokens = tf.maximum(_all_reduce_sum(local_tokens), 1.0)
        variables = self.trainable_variables
        k = self.accum_steps
        summed, loss_total = None, 0.0
        for i in range(k):  # static loop: micro-batch i takes rows i, i+k, i+2k, ...
            src, tgt_in, tgt_out = (
                (source_ids, target_in_ids, target_out_ids)
                if k == 1
                else (source_ids[i::k], target_in_ids[i::k], target_out_ids[i::k])
            )
            with tf.GradientTape() as tape:
                logits = self((src, tgt_in), training=True)
                loss_sum, _ = loss_fn.sum_and_count(tgt_out, logits)
                scaled = self.optimizer.scale_loss(loss_sum / global_tokens)
            # dense gradients: the embedding's IndexedSlices (one per lookup) cannot be
            # all-reduced across replicas whose batches differ in shape
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
            summed = grads if summed is None else [a + b for a, b in zip(summed, grads)]
            loss_total += loss_sum
            self._update_token_metrics(tgt_out, logits)
        self.optimizer.apply(summed, variables)
        return self._record_loss(loss_total, local_tokens)

    def test_step(self, data):
        (source_ids, target_in_ids), target_out_ids = data[:2] if isinstance(data, tuple) else data
        logits = self((source_ids, target_in_ids), training=False)
        loss_sum, count = self._token_loss().sum_and_count(target_out_ids, logits)
        self._update_token_metrics(target_out_ids, logits)
        return self._record_loss(loss_sum, count)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras takes a sample batch by reducing a distributed batch with MEAN, which fails
        # when replicas hold different numbers of rows (token-budget batches rarely split
        # evenly). Take the first replica's rows instead.
        if iterator is not None and self._distribute_strategy is not None:
            local = self._distribute_strategy.experimental_local_results
            for _, _, it in iterator:
                data_batch = tf.nest.map_structure(
                    lambda x: local(x)[0] if isinstance(x, tf.distribute.DistributedValues) else x,
                    next(it),
                )
                break
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _update_token_metrics(self, y_true, logits):
        if getattr(self, "_compile_metrics", None) is not None:
            self._compile_metrics.update_state(y_true, logits)

    def _record_loss(self, loss_sum, tokens):
        # per-token mean, weighted by tokens so replicas aggregate to the global mean
        self._loss_tracker.update_state(loss_sum / tf.maximum(tokens, 1.0), sample_weight=tokens)
        results = self.get_metrics_result()
        if isinstance(self.distribute_strategy, tf.distribute.MultiWorkerMirroredStrategy):
            # Keras reduces step outputs of multi-worker runs with reduce(MEAN, axis=0),
            # which needs a leading axis: give each scalar one, the reduction removes it
            results = tf.nest.map_structure(lambda v: tf.reshape(v, [1]), results)
        return results

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _all_reduce_sum(value):
    """Sum over replicas inside a distribution strategy; identity outside one."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
