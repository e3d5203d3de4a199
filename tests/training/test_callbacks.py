import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_dir import Run
from keras_transformer.training import callbacks as cb


def compiled_model():
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=30))
    model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
    model.optimizer.build(model.trainable_variables)
    return model


def test_nan_loss_stops_training_keeps_the_last_good_checkpoint(tmp_path):
    model = compiled_model()
    state = cb.StepState(model)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 3)
    guard = cb.NonFiniteLossGuard(manager)
    saver = cb.CheckpointEvery(manager, state, every=1, guard=guard)
    for callback in (guard, saver):
        callback.set_model(model)
    model.optimizer.iterations.assign(1)
    guard.on_train_batch_end(0, {"loss": 2.5})
    saver.on_train_batch_end(0, {"loss": 2.5})
    good = manager.latest_checkpoint
    assert good.endswith("ckpt-1")
    model.optimizer.iterations.assign(2)
    guard.on_train_batch_end(1, {"loss": float("nan")})
    saver.on_train_batch_end(1, {"loss": float("nan")})
    saver.on_epoch_end(0)
    assert model.stop_training
    assert manager.latest_checkpoint == good  # the NaN state was not saved
    with pytest.raises(cb.TrainingError, match=r"NaN/Inf at step 2.*ckpt-1"):
        guard.check()


def test_metrics_logger_writes_json_lines(tmp_path):
    model = compiled_model()
    run = Run(str(tmp_path))
    logger = cb.MetricsLogger(run, cb.StepState(model), every=1)
    logger.set_model(model)
    model.optimizer.iterations.assign(3)
    logger.on_train_batch_end(0, {"loss": np.float32(1.5), "accuracy": 0.25})
    logger.on_epoch_end(0, {"loss": 1.4, "val_loss": 1.6})
    records = run.read_metrics()
    assert records[0]["step"] == 3 and records[0]["loss"] == 1.5 and records[0]["learning_rate"] > 0
    assert records[1]["event"] == "epoch" and records[1]["val_loss"] == 1.6
