import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_dir import Run
from keras_transformer.settings.args import TrainArgs
from keras_transformer.training import callbacks as cb
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import set_precision
from keras_transformer.training.trainer import fit_to_step


def compiled_model():
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=30))
    model.build()
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


class FixedBleu:
    """A stand-in translation function: the BLEU it gets is set by the test."""

    def __init__(self, callback, scores):
        self.callback, self.scores = callback, iter(scores)

    def evaluate(self):
        return {"bleu": next(self.scores)}


def bleu_callback(model, tmp_path, scores):
    run = Run(str(tmp_path))
    state = cb.StepState(model)
    evaluation = cb.BleuEvaluation(
        lambda x: None,
        ["a"],
        ["a"],
        every=1,
        best_dir=run.path("best"),
        model=model,
        state=state,
        metrics=cb.MetricsLogger(run, state, every=0, enabled=False),
        log_dir=None,
    )
    evaluation.evaluate = FixedBleu(evaluation, scores).evaluate
    evaluation.set_model(model)
    return run, evaluation


def test_nothing_is_evaluated_or_saved_at_step_0(tmp_path):
    """float16 loss scaling can skip the first steps: step 0 has nothing to keep."""
    model = compiled_model()
    run, evaluation = bleu_callback(model, tmp_path, [10.0])
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path / "c"), 3)
    saver = cb.CheckpointEvery(
        manager, cb.StepState(model), every=1, guard=cb.NonFiniteLossGuard(None)
    )
    saver.set_model(model)
    for callback in (evaluation, saver):
        callback.on_train_batch_end(0, {"loss": 2.0})
        callback.on_epoch_end(0, {"loss": 2.0})
    assert manager.latest_checkpoint is None and not run.checkpoints(best=True)
    assert evaluation.last_bleu is None


def test_non_finite_weights_never_reach_best(tmp_path):
    model = compiled_model()
    run, evaluation = bleu_callback(model, tmp_path, [0.0, 5.0])
    model.optimizer.iterations.assign(1)
    weight = model.trainable_variables[0]
    weight.assign(tf.fill(weight.shape, float("nan")))
    evaluation.on_train_batch_end(0)
    assert evaluation.last_bleu == 0.0 and not run.checkpoints(best=True)
    # and after the loss guard has fired, nothing is evaluated at all
    evaluation.guard = cb.NonFiniteLossGuard(None)
    evaluation.guard.failed_step = 2
    model.optimizer.iterations.assign(2)
    evaluation.on_epoch_end(0)
    assert evaluation.last_bleu == 0.0


def test_best_keeps_its_own_score_and_a_resume_takes_the_max(tmp_path):
    """Killed after best/ was saved (BLEU 30 at step 4) but before the training checkpoint
    that would hold that score: the resumed run must not replace best/ with a BLEU of 20."""
    model = compiled_model()
    run, first = bleu_callback(model, tmp_path, [30.0])
    model.optimizer.iterations.assign(4)
    first.on_train_batch_end(0)
    assert run.checkpoints(best=True)[-1].endswith("ckpt-4")
    # a restart whose training checkpoint predates that evaluation (best BLEU unknown: -1)
    run, resumed = bleu_callback(model, tmp_path, [20.0])
    resumed.restore_best(run)
    assert float(resumed.progress.best.numpy()) == 30.0
    assert int(resumed.progress.best_step.numpy()) == 4
    model.optimizer.iterations.assign(6)
    resumed.on_train_batch_end(0)
    assert run.checkpoints(best=True)[-1].endswith("ckpt-4")  # 20 < 30: best/ kept


def test_metrics_after_a_resume_hold_each_event_once(tmp_path):
    model = compiled_model()
    run = Run(str(tmp_path))
    logger = cb.MetricsLogger(run, cb.StepState(model), every=1)
    logger.set_model(model)
    for step in (1, 2, 3):
        model.optimizer.iterations.assign(step)
        logger.on_train_batch_end(0, {"loss": 1.0})
    model.optimizer.iterations.assign(2)  # restored from the checkpoint at step 2
    resumed = cb.MetricsLogger(run, cb.StepState(model), every=1)
    resumed.set_model(model)
    resumed.resume()
    model.optimizer.iterations.assign(3)
    resumed.on_train_batch_end(0, {"loss": 1.0})
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]


def test_an_epochs_last_batch_is_saved_after_the_epoch_end_work(tmp_path):
    """A --checkpoint-every step that ends an epoch is saved at the epoch's end (after
    validation, BLEU, best/ and patience), not at its batch end before that work; any other
    such step at its batch end."""
    model = compiled_model()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(tmp_path), 3)
    saver = cb.CheckpointEvery(
        manager, cb.StepState(model), every=5, guard=cb.NonFiniteLossGuard(None)
    )
    saver.set_model(model)
    saver.set_params({"steps": 10, "epochs": 1, "verbose": 0})
    model.optimizer.iterations.assign(5)
    saver.on_train_batch_end(4)  # mid-epoch: saved now
    assert manager.latest_checkpoint.endswith("ckpt-5")
    model.optimizer.iterations.assign(10)
    saver.on_train_batch_end(9)  # the epoch's last batch: not yet
    assert manager.latest_checkpoint.endswith("ckpt-5")
    saver.on_epoch_end(0)
    assert manager.latest_checkpoint.endswith("ckpt-10")


def test_a_best_newer_than_the_restored_checkpoint_is_redone(tmp_path):
    """Killed after best/ was saved at step 4 but before the checkpoint of step 4: the run
    resumed at step 2 leaves that best/ out (it evaluates step 4 again, with the same weights
    and so the same score, and the same patience)."""
    model = compiled_model()
    run, first = bleu_callback(model, tmp_path, [30.0])
    model.optimizer.iterations.assign(4)
    first.on_train_batch_end(0)
    run, resumed = bleu_callback(model, tmp_path, [30.0])
    resumed.restore_best(run, step=2)
    assert float(resumed.progress.best.numpy()) == -1.0
    resumed.on_train_batch_end(0)  # step 4 again
    assert float(resumed.progress.best.numpy()) == 30.0
    assert int(resumed.progress.bad_evals.numpy()) == 0
    assert run.checkpoints(best=True)[-1].endswith("ckpt-4")


def test_a_resume_drops_the_tensorboard_events_past_its_step(tmp_path):
    """Events written past the restored step (and a last record the kill cut short) leave
    the event files; the ones up to the step stay."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder = tmp_path / "logs" / "train"
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        for step in range(5, 31, 5):
            tf.summary.scalar("loss", float(step), step=step)
    writer.close()
    (path,) = folder.iterdir()
    with open(path, "ab") as handle:
        handle.write(b"\x10\x00\x00")  # half a record
    cb.truncate_events(str(folder), 20)
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    assert [e.step for e in accumulator.Tensors("loss")] == [5, 10, 15, 20]


def write_events(folder, steps):
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        for step in steps:
            tf.summary.scalar("loss", float(step), step=step)
    writer.close()


def summary_steps(folder):
    """The steps of every summary in the event files of `folder` (any gfile scheme)."""
    from tensorflow.core.util import event_pb2

    steps = []
    for path in sorted(tf.io.gfile.glob(f"{folder}/events.out.tfevents*")):
        for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
            event = event_pb2.Event.FromString(record)
            if event.HasField("summary"):
                steps.append(event.step)
    return steps


def test_event_truncation_goes_through_gfile():
    """--model-dir gs://...: the event files are truncated through tf.io.gfile (here
    TensorFlow's in-memory ram:// file system, which os.path cannot see)."""
    import uuid

    folder = f"ram://kt-{uuid.uuid4().hex}/logs/train"
    write_events(folder, range(5, 31, 5))
    cb.truncate_events(folder, 20)
    assert summary_steps(folder) == [5, 10, 15, 20]
    assert not tf.io.gfile.glob(f"{folder}/*.tmp")


def test_a_restart_with_nothing_to_restore_drops_the_killed_runs_events(tmp_path):
    """Killed before its first checkpoint, a run starts again from step 0 and writes every
    event again: the killed run's metrics.jsonl lines and TensorBoard summaries go."""
    model = compiled_model()
    run = Run(str(tmp_path))
    for step in (5, 5):
        run.append_metrics({"event": "train", "step": step})
    write_events(tmp_path / "logs" / "train", [5])
    write_events(tmp_path / "logs" / "validation", [5])
    logger = cb.MetricsLogger(run, cb.StepState(model), every=1)
    logger.resume(restored=False)
    assert run.read_metrics() == []
    for folder in ("train", "validation"):
        assert summary_steps(tmp_path / "logs" / folder) == []
        assert len(list((tmp_path / "logs" / folder).iterdir())) == 1  # the file stays


class NonFiniteAt(TrainingModel):
    """A NaN loss (and NaN gradients) on the batches at the given stream positions."""

    def __init__(self, transformer, positions):
        super().__init__(transformer)
        self.positions = tf.constant(positions, tf.int64)

    def compute_gradients(self, *args):
        grads, loss = super().compute_gradients(*args)
        hit = tf.reduce_any(tf.equal(tf.cast(self.data_position, tf.int64), self.positions))
        poison = tf.where(hit, float("nan"), 0.0)
        return [grads[0] + tf.cast(poison, grads[0].dtype), *grads[1:]], loss + poison


def fit_with_nan(precision, positions, tolerance, steps=6):
    """(model, guard, error) of a tiny run of `steps` updates with NaN losses at `positions`."""
    set_precision(precision)
    try:
        transformer = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=40))
        model = NonFiniteAt(transformer, positions)
        model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
        rng = np.random.default_rng(0)
        src = rng.integers(4, 40, size=(4, 7)).astype("int32")
        tgt = rng.integers(4, 40, size=(4, 6)).astype("int32")
        data = tf.data.Dataset.from_tensors(((src, tgt), tgt)).repeat()
        guard = cb.NonFiniteLossGuard(None, tolerance)
        callbacks = [guard, cb.StopAtStep(cb.StepState(model), steps)]
        settings = TrainArgs(train_steps=steps, steps_per_epoch=20, verbose=0)
        try:
            fit_to_step(model, lambda position: data, None, callbacks, settings)
        except cb.TrainingError as err:
            return model, guard, str(err)
        return model, guard, None
    finally:
        set_precision("float32")


def test_isolated_float16_nans_are_skipped_a_run_of_them_stops():
    """mixed_float16: NaN losses on batches 1, 3 and 4 (two in a row) with --nonfinite-steps
    2 are skipped like overflows (no update, the loss scale halved, the epoch's loss finite)
    and training reaches its step count; three in a row stop it, naming the step."""
    model, guard, error = fit_with_nan("mixed_float16", [1, 3, 4], tolerance=2)
    assert error is None and guard.skipped == 3
    assert int(model.optimizer.iterations.numpy()) == 6
    assert int(model.data_position.numpy()) == 9  # 3 skipped batches + 6 updates
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**15 / 8
    assert all(np.isfinite(w).all() for w in model.get_weights())
    model, guard, error = fit_with_nan("mixed_float16", [1, 2, 3], tolerance=2)
    assert error is not None and "NaN/Inf at step 1 (3 steps in a row)" in error
    assert int(model.data_position.numpy()) == 4


def test_a_float32_nan_stops_at_once_whatever_the_tolerance():
    _, guard, error = fit_with_nan("float32", [2], tolerance=5)
    assert guard.skipped == 0 and error is not None and "NaN/Inf at step 3" in error


def test_workers_that_restored_different_steps_are_named():
    """After a restore, every worker's step is compared with the chief's: a worker that
    could not see the run directory (step 0) is named, the job stops with one line."""
    cb.check_same_step([40, 40, 40], ["chief:0", "worker:0", "worker:1"])
    with pytest.raises(cb.TrainingError, match=r"chief:0 at step 40, worker:1 at step 0;"):
        cb.check_same_step([40, 40, 0], ["chief:0", "worker:0", "worker:1"])
    assert cb.replica_steps(tf.distribute.get_strategy(), 7) == [7]


def test_the_step_is_read_once_per_batch_by_all_callbacks():
    """The callbacks after the shared StepState get the step it read at the batch's end: one
    `.numpy()` per batch however many callbacks read it (each callback read it itself)."""
    import keras

    class Reader(keras.callbacks.Callback):
        def __init__(self, state):
            super().__init__()
            self.state, self.seen = state, []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append((self.state.step, self.state.step))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    state = cb.StepState.of(model)
    assert cb.StepState.of(model) is state
    readers = [Reader(state), Reader(state)]
    stop = cb.StopAtStep(state, 100)
    x = np.ones((6, 2), "float32")
    model.fit(x, x[:, :1], batch_size=2, epochs=1, verbose=0, callbacks=[state, *readers, stop])
    assert readers[0].seen == readers[1].seen == [(1, 1), (2, 2), (3, 3)]
    assert state.reads == 3
    model.optimizer.iterations.assign(7)  # outside a batch, the variable itself
    assert state.step == 7 and state.reads == 4
