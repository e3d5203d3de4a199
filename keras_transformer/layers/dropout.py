"""Dropout that draws independent masks on every replica of a distribution strategy."""

from __future__ import annotations

import keras
import tensorflow as tf


def replica_index():
    """(replica id across all workers, number of replicas) inside a replica context of a
    strategy with several replicas; None elsewhere (one device, cross-replica context)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context.replica_id_in_sync_group, context.num_replicas_in_sync


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` whose masks differ across the replicas of a strategy.

    Keras 3 keeps a dropout layer's RNG state in one `SeedGenerator` variable; under
    `tf.distribute` that variable is mirrored, so every replica (and every worker, each
    seeded the same way) reads the same state and draws the same mask: N replicas apply
    1/N of the independent masks the paper's global batch gets on one device. Here the
    replica's id in the sync group (global across the workers of a
    `MultiWorkerMirroredStrategy`) is folded into the drawn seed
    (`tf.random.experimental.stateless_fold_in`). The state still advances once per call
    on every replica alike, so it is saved and restored with the checkpoints as before and
    a resumed run draws the masks an uninterrupted one would.

    Outside a multi-replica context (one device, no strategy, cross-replica calls) this is
    exactly `keras.layers.Dropout`: the same masks, bit for bit.

    Args:
        rate: the fraction of the input units to drop, in [0, 1).
        noise_shape, seed: as `keras.layers.Dropout`.

    Call arguments:
        inputs: a tensor of any shape (..., D).
        training: drop units (True) or pass `inputs` through (False).

    Returns:
        The same shape as `inputs`: kept units scaled by 1 / (1 - rate).

    Example:
        >>> Dropout(0.1)(tf.ones([2, 3, 8]), training=False).shape
        TensorShape([2, 3, 8])
    """

    def call(self, inputs, training=False):
        replica = replica_index() if training and self.rate > 0 else None
        if replica is None:
            return super().call(inputs, training=training)
        replica_id, _ = replica
        # what keras.src.backend.tensorflow.random.dropout does, with the replica folded in
        state = self.seed_generator.next()
        seed = tf.cast(tf.math.floormod(state, tf.int32.max - 1), tf.int32)
        seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica_id, tf.int32))
        noise_shape = None
        if self.noise_shape is not None:
            dynamic = tf.shape(inputs)
            noise_shape = [
                dynamic[i] if dim is None else dim for i, dim in enumerate(self.noise_shape)
            ]
        return tf.nn.experimental.stateless_dropout(
            inputs, rate=self.rate, noise_shape=noise_shape, seed=seed
        )


__all__ = ["Dropout", "replica_index"]
