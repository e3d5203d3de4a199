"""A resume across a changed replica layout: another worker count, other devices per worker,
or a run moved between one stream (one device, `mirrored`) and `multi_worker`.

A multi-worker checkpoint holds the next stream position of every replica (`replica_next`)
and the number of input streams, one per worker (`input_workers`): worker w of W reads pairs
w, w + W, ... of every chunk of a pass (`data.training_batches(shard=...)`). A stream
position inside one worker's share means nothing to a job whose workers share the chunk
another way, so a resume under another layout re-shards at a stated boundary: the start of
the earliest chunk (100,000 raw pairs of a pass's order, the same for every layout) that a
replica had not finished. Nothing is skipped; the pairs of that chunk and of the later chunks
some replica had already started are trained on again, and the batches differ from the old
layout's. A warning line says so. Weights, optimizer slots, the loss scale and the dropout
RNG are per-run, not per-replica, and restore as they are.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tensorflow as tf

from keras_transformer.data.pipeline import CHUNK_BITS, POSITION_BITS

logger = logging.getLogger("keras_transformer")

# the checkpoint keys of the per-replica stream state (tf.train.Checkpoint's naming)
PER_REPLICA = ("replica_next", "input_workers")


def _key(name: str) -> str:
    return f"{name}/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a job reads its training stream: `workers` input streams (None: one stream that
    every replica shares, as on one device or under `mirrored`) for `replicas` replicas."""

    workers: int | None
    replicas: int | None

    def __str__(self) -> str:
        if self.workers is None:
            return "one input stream (one device or --strategy mirrored)"
        workers = "an unrecorded number of" if self.workers == 0 else str(self.workers)
        return f"{workers} worker stream(s) for {self.replicas} replicas (--strategy multi_worker)"


def model_layout(model) -> Layout:
    """The layout of this run's `TrainingModel`."""
    if model.replica_next is None:
        return Layout(None, None)
    return Layout(int(model.input_workers.numpy()), int(model.replica_next.shape[0]))


def saved_layout(reader) -> Layout:
    """The layout a checkpoint was written under (`reader`: `tf.train.load_checkpoint`).
    A multi-worker checkpoint from before `input_workers` has workers 0 (unrecorded)."""
    shapes = reader.get_variable_to_shape_map()
    if _key("replica_next") not in shapes:
        return Layout(None, None)
    workers = _key("input_workers")
    count = int(reader.get_tensor(workers)) if workers in shapes else 0
    return Layout(count, int(shapes[_key("replica_next")][0]))


def same_stream(saved: Layout, current: Layout) -> bool:
    """The saved positions mean the same to this job (an unrecorded worker count is taken
    to be unchanged when the replica count is)."""
    if saved.workers == 0 and current.workers is not None:
        return saved.replicas == current.replicas
    return saved == current


def chunk_start(positions) -> int:
    """The start of the earliest (pass, chunk) among the stream `positions` (0: a replica
    that never trained on a batch, ignored unless all are)."""
    started = [int(p) for p in np.ravel(positions) if int(p) > 0]
    if not started:
        return 0
    return min(started) & ~((1 << CHUNK_BITS) - 1)


def restore(checkpoint: tf.train.Checkpoint, path: str, model) -> None:
    """`checkpoint.restore(path)`, asserting every object matched, under this run's layout:
    when it differs from the checkpoint's, the per-replica stream state is left out of the
    restore and every stream restarts at `chunk_start` of the saved positions, with a
    warning naming both layouts. Raises what `tf.train.Checkpoint.restore` raises."""
    reader = tf.train.load_checkpoint(path)
    saved, current = saved_layout(reader), model_layout(model)
    keys = reader.get_variable_to_shape_map()
    same = same_stream(saved, current)
    if same and all(_key(name) in keys for name in PER_REPLICA if name in vars(checkpoint)):
        checkpoint.restore(path).assert_existing_objects_matched()  # the ordinary resume
        return
    # restored through a checkpoint without the state of another layout (and what the file
    # lacks); not by detaching it from `checkpoint`: re-attached, it would be restored then
    left_out = {name for name in PER_REPLICA if not same or _key(name) not in keys}
    children = {k: v for k, v in vars(checkpoint).items() if not k.startswith("_")}
    partial = tf.train.Checkpoint(**{k: v for k, v in children.items() if k not in left_out})
    status = partial.restore(path).assert_existing_objects_matched()
    # `partial` has a save counter of its own: the run's continues from the checkpoint's
    checkpoint.save_counter.assign(reader.get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE"))
    if left_out:
        status.expect_partial()  # the values left out are not restored, by design
    if same:
        return
    old = reader.get_tensor(_key("replica_next" if saved.workers is not None else "data_next"))
    start = chunk_start(old)
    if model.replica_next is not None:
        model.replica_next.assign(tf.fill(model.replica_next.shape, tf.constant(start, tf.int64)))
    model.data_next.assign(start)
    logger.warning(
        "the checkpoint was written with %s, this job has %s: every stream restarts at the "
        "start of chunk %d of pass %d (stream position %d); the pairs of that chunk and of "
        "the later ones a replica had begun are trained on again, and the batches differ "
        "from the old layout's",
        saved,
        current,
        (start & ((1 << POSITION_BITS) - 1)) >> CHUNK_BITS,
        start >> POSITION_BITS,
        start,
    )


def checkpoint_items(model) -> dict:
    """The per-replica stream state of a multi-worker run, for its `tf.train.Checkpoint`."""
    if model.replica_next is None:
        return {}
    return {"replica_next": model.replica_next, "input_workers": model.input_workers}
