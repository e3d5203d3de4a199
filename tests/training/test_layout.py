"""A resume under another replica layout (training.layout): the per-replica stream state of
the old layout is left out and every stream restarts at the start of the earliest chunk."""

import logging
import types

import pytest
import tensorflow as tf

from keras_transformer.data.pipeline import stream_position
from keras_transformer.training import layout


def state(workers, replicas, positions=None, data_next=0):
    """A TrainingModel's stream state (`workers` None: one stream) and its checkpoint."""
    model = types.SimpleNamespace(
        data_next=tf.Variable(data_next, dtype=tf.int64), replica_next=None
    )
    if workers is not None:
        model.replica_next = tf.Variable(positions or [0] * replicas, dtype=tf.int64)
        model.input_workers = tf.Variable(workers, dtype=tf.int64)
    weight = tf.Variable([1.0, 2.0])
    items = {"data_next": model.data_next, "weight": weight, **layout.checkpoint_items(model)}
    return model, weight, tf.train.Checkpoint(**items)


SAVED = [stream_position(1, 7, chunk=3), stream_position(1, 2, chunk=4)]


def saved_checkpoint(tmp_path, workers=2, positions=SAVED):
    model, weight, checkpoint = state(workers, len(positions), positions, data_next=max(positions))
    weight.assign([5.0, 6.0])
    return checkpoint.save(str(tmp_path / "ckpt"))


@pytest.mark.parametrize("workers,replicas", [(1, 2), (3, 3), (None, None)])
def test_another_layout_restarts_every_stream_at_the_earliest_chunk(
    tmp_path, caplog, workers, replicas
):
    """2 workers x 1 device restored as 1 worker x 2 devices, as 3 workers, as one stream
    (mirrored): the weights are restored, every stream starts at chunk 3 of pass 1, and the
    warning names both layouts."""
    path = saved_checkpoint(tmp_path)
    model, weight, checkpoint = state(workers, replicas)
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        layout.restore(checkpoint, path, model)
    start = stream_position(1, 0, chunk=3)
    assert weight.numpy().tolist() == [5.0, 6.0]
    assert int(model.data_next.numpy()) == start
    if workers is not None:
        assert model.replica_next.numpy().tolist() == [start] * replicas
        assert int(model.input_workers.numpy()) == workers  # this job's, saved from now on
        assert "replica_next" in checkpoint._trackable_children()  # still saved
    (line,) = [r.getMessage() for r in caplog.records if r.name == "keras_transformer"]
    assert "2 worker stream(s) for 2 replicas" in line and "chunk 3 of pass 1" in line
    assert str(layout.model_layout(model)) in line


def test_a_single_stream_checkpoint_resumes_under_multi_worker(tmp_path):
    """mirrored -> multi_worker: the old stream's next position gives the chunk."""
    path = saved_checkpoint(tmp_path, workers=None, positions=[stream_position(2, 9, chunk=1)])
    model, _, checkpoint = state(2, 2)
    layout.restore(checkpoint, path, model)
    assert model.replica_next.numpy().tolist() == [stream_position(2, 0, chunk=1)] * 2


def test_the_same_layout_resumes_each_stream_exactly(tmp_path, caplog):
    path = saved_checkpoint(tmp_path)
    model, _, checkpoint = state(2, 2)
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        layout.restore(checkpoint, path, model)
    assert model.replica_next.numpy().tolist() == SAVED
    assert not [r for r in caplog.records if r.name == "keras_transformer"]


def test_a_checkpoint_without_the_worker_count_resumes_when_the_replicas_match(tmp_path):
    """Written before `input_workers` existed: the same replica count is the same layout."""
    positions = tf.Variable(SAVED, dtype=tf.int64)
    path = tf.train.Checkpoint(replica_next=positions).save(str(tmp_path / "old"))
    model, _, checkpoint = state(2, 2)
    del checkpoint.weight, checkpoint.data_next  # the old checkpoint holds neither
    layout.restore(checkpoint, path, model)
    assert model.replica_next.numpy().tolist() == SAVED
    assert "input_workers" in checkpoint._trackable_children()


def test_chunk_start_ignores_replicas_that_never_trained():
    assert layout.chunk_start([0, stream_position(0, 5, chunk=2)]) == stream_position(0, 0, 2)
    assert layout.chunk_start([0, 0]) == 0
