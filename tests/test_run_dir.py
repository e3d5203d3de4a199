import os

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import run_dir


def test_average_of_checkpoints_is_the_mean_of_weights(tmp_path):
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=30))
    model.build()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), str(tmp_path / "checkpoints"), 5
    )
    snapshots = []
    for step in (1, 2, 3):
        model.set_weights([w + step for w in model.get_weights()])
        snapshots.append(model.get_weights())
        manager.save(checkpoint_number=step)
    paths = run_dir.checkpoint_paths(str(tmp_path))
    assert [p.rsplit("-", 1)[1] for p in paths] == ["1", "2", "3"]
    run_dir.restore_average(model, paths[-2:])
    for got, a, b in zip(model.get_weights(), snapshots[1], snapshots[2]):
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6)


def test_half_written_checkpoint_is_ignored(tmp_path):
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=30))
    model.build()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model), str(tmp_path / "checkpoints"), 5
    )
    manager.save(checkpoint_number=1)
    # a save killed before its state-file update leaves files the state does not list
    with open(os.path.join(tmp_path, "checkpoints", "ckpt-2.data-00000-of-00001"), "wb") as handle:
        handle.write(b"partial")
    assert run_dir.checkpoint_paths(str(tmp_path))[-1].endswith("ckpt-1")


def test_missing_pieces_are_named(tmp_path):
    with pytest.raises(run_dir.RunDirError, match="config.json not found"):
        run_dir.load_trained(str(tmp_path))
