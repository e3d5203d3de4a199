"""--async-checkpoint (training.async_checkpoint, CheckpointEvery(asynchronous=True)): the
files equal a synchronous save's, one write at a time, the state file names a checkpoint
only once written, a failed write raises in the caller's thread."""

import json
import os
import subprocess
import sys
import threading
import time
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.training import callbacks as cb
from keras_transformer.training.async_checkpoint import AsyncWrites


def training_state():
    """A tiny Transformer, its Adam slots and a step variable, and one training step."""
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=40))
    ids = tf.constant([[1, 5, 7, 2, 0], [1, 9, 2, 0, 0]], tf.int32)
    model((ids, ids))
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    items = {"model": model, "optimizer": optimizer, "step": tf.Variable(0, dtype=tf.int64)}

    def train():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model((ids, ids))))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        items["step"].assign_add(1)

    return items, train


def tensors(path) -> dict:
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def gated(manager, callback):
    """`manager.save` with `callback` run by the writer after the files, before the manager
    records the checkpoint (as KillSwitch's "save" phase)."""
    save = manager.save

    def save_with(*args, options=None, **kwargs):
        options.experimental_write_callbacks = [callback]
        return save(*args, options=options, **kwargs)

    manager.save = save_with


@pytest.mark.slow
def test_async_saves_hold_the_tensors_of_synchronous_saves_of_the_same_step(tmp_path):
    items, train = training_state()
    sync = tf.train.CheckpointManager(tf.train.Checkpoint(**items), str(tmp_path / "s"), 5)
    writes = AsyncWrites(
        tf.train.CheckpointManager(tf.train.Checkpoint(**items), str(tmp_path / "a"), 5)
    )
    for step in (1, 2, 3):  # TensorFlow's own async save fails at the second (Keras 3.15)
        train()
        sync.save(checkpoint_number=step)
        writes.save(step)
        train()  # the weights change while the write is in flight
        writes.wait()
    assert writes.manager.checkpoints == [str(tmp_path / "a" / f"ckpt-{s}") for s in (1, 2, 3)]
    for step in (1, 2, 3):
        expected = tensors(sync.checkpoints[step - 1])
        got = tensors(writes.manager.checkpoints[step - 1])
        assert sorted(got) == sorted(expected) and len(got) > 50  # object graph included
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    # and it restores with today's code: the weights of step 3
    before = [v.numpy() for v in items["model"].weights]
    tf.train.Checkpoint(**items).restore(writes.manager.latest_checkpoint).assert_consumed()
    assert any(not np.array_equal(a, v.numpy()) for a, v in zip(before, items["model"].weights))
    tf.train.Checkpoint(**items).restore(sync.checkpoints[-1]).assert_consumed()


@pytest.mark.slow
def test_one_write_at_a_time_and_recorded_only_once_written(tmp_path):
    items, train = training_state()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**items), str(tmp_path), 5)
    gate, written = threading.Event(), []
    gated(manager, lambda path: (written.append(path), gate.wait(30)))
    writes = AsyncWrites(manager)
    train()
    writes.save(1)  # returns while the writer waits at the gate, its files written
    second = threading.Thread(target=lambda: (train(), writes.save(2)))
    second.start()
    second.join(1.0)
    assert second.is_alive()  # the next save waits for the write in flight
    assert written == [str(tmp_path / "ckpt-1")]
    assert tf.train.get_checkpoint_state(str(tmp_path)) is None  # a kill now: nothing listed
    gate.set()
    second.join(30)
    writes.wait()
    assert written == [str(tmp_path / f"ckpt-{s}") for s in (1, 2)]
    assert tf.train.get_checkpoint_state(str(tmp_path)).model_checkpoint_path.endswith("ckpt-2")


@pytest.mark.slow
def test_a_failed_write_raises_one_line_in_the_callers_thread(tmp_path):
    items, train = training_state()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**items), str(tmp_path), 5)

    def fail(path):
        raise OSError("No space left on device\nmore detail")

    gated(manager, fail)
    guard = cb.NonFiniteLossGuard(manager)
    state = types.SimpleNamespace(step=1)
    saver = cb.CheckpointEvery(manager, state, 1, guard, asynchronous=True)
    saver.on_train_batch_end(0)  # the write fails in the background
    with pytest.raises(cb.TrainingError) as raised:
        saver.on_train_end()  # joined at every fit's end
    assert str(raised.value) == (
        f"asynchronous checkpoint write of step 1 in {tmp_path} failed: "
        "OSError: No space left on device"
    )
    assert (
        manager.latest_checkpoint is None and tf.train.get_checkpoint_state(str(tmp_path)) is None
    )


@pytest.mark.slow
def test_the_preemption_save_returns_once_its_checkpoint_is_written_and_listed(tmp_path):
    items, train = training_state()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(**items), str(tmp_path), 5)
    gated(manager, lambda: time.sleep(1.0))  # a slow disk
    state = types.SimpleNamespace(step=1)
    saver = cb.CheckpointEvery(manager, state, 0, cb.NonFiniteLossGuard(manager), asynchronous=True)
    train()
    path = saver.save()  # PreemptionSave's: the process exits right after it
    assert path == str(tmp_path / "ckpt-1")
    assert tf.train.get_checkpoint_state(str(tmp_path)).model_checkpoint_path == path


@pytest.mark.slow
def test_async_saves_of_mirrored_variables_equal_synchronous_ones(tmp_path):
    """MirroredStrategy on 2 logical CPUs (replica_async_checkpoint.py, its own process)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    out = subprocess.run(
        [sys.executable, os.path.join(here, "replica_async_checkpoint.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["variable"] == "MirroredVariable" and result["checkpoints"] == 3
    assert result["keys"] > 50 and result["differ"] == []


@pytest.mark.slow
def test_kt_train_killed_inside_an_async_write_resumes_from_the_previous_checkpoint(
    tmp_path, mini_multi30k_dir
):
    """kt-train --async-checkpoint, killed (SIGKILL's os._exit) by the background writer
    after step 4's files and before the state file: step 2 is the newest checkpoint, and the
    same command resumes from it and writes step 4."""
    from keras_transformer.run_dir import Run
    from tests.training.trainer_runs import run_train

    model_dir = tmp_path / "run"
    flags = ["--train-steps", "4", "--checkpoint-every", "2", "--async-checkpoint"]
    flags += ["--steps-per-epoch", "40", "--eval-every", "100"]
    env = {**os.environ, "KT_KILL_AT": "4:save"}
    killed = run_train(model_dir, mini_multi30k_dir, *flags, env=env, check=False)
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert os.path.exists(model_dir / "checkpoints" / "ckpt-4.index")  # written, not listed
    assert [os.path.basename(p) for p in Run(str(model_dir)).checkpoints()] == ["ckpt-2"]
    out = run_train(model_dir, mini_multi30k_dir, *flags)
    assert "at step 2" in out.stdout + out.stderr
    assert [os.path.basename(p) for p in Run(str(model_dir)).checkpoints()] == ["ckpt-2", "ckpt-4"]
