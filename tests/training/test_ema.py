"""--ema-decay: the moving average of the weights (training.ema, optimization.AveragingAdam)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_dir import EMA_KEY, Run, load_trained
from keras_transformer.settings.args import TrainArgs
from keras_transformer.training import callbacks as cb
from keras_transformer.training import ema
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import set_precision
from keras_transformer.training.trainer import fit_to_step
from tests.training.small_corpus import run_commands, train_argv, write_corpus

DECAY = 0.6


def batches():
    rng = np.random.default_rng(0)
    src = rng.integers(4, 40, size=(4, 7)).astype("int32")
    tgt = rng.integers(4, 40, size=(4, 6)).astype("int32")
    return tf.data.Dataset.from_tensors(((src, tgt), tgt)).repeat()


class Recorder(keras.callbacks.Callback):
    """The trainable weights after every applied update (skipped float16 steps left out)."""

    def __init__(self):
        super().__init__()
        self.weights, self.step = [], 0

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step > self.step:
            self.step = step
            self.weights.append([v.numpy().copy() for v in self.model.trainable_variables])


def closed_form(history, decay):
    """EMA after n updates w_1..w_n (the first update copies the weights):
    decay^(n-1) w_1 + sum over k = 2..n of (1 - decay) decay^(n-k) w_k."""
    n = len(history)
    return [
        decay ** (n - 1) * history[0][i]
        + sum((1 - decay) * decay ** (n - k) * history[k - 1][i] for k in range(2, n + 1))
        for i in range(len(history[0]))
    ]


def one_layer_transformer():
    """The tiny preset cut to one layer: the average is the same arithmetic on any weights,
    and fit traces half the layers (measured: 14.3 -> 8.8 s float32, 18.3 -> 9.4 s float16)."""
    return kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=40, num_layers=1))


def train_tiny(model_class, precision, steps):
    set_precision(precision)
    transformer = one_layer_transformer()
    model = model_class(transformer)
    model.compile(
        optimizer=kt.paper_optimizer(64, 10, ema_decay=DECAY), loss=kt.LabelSmoothedCrossEntropy()
    )
    recorder = Recorder()
    model.fit(batches(), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[recorder])
    return model, recorder.weights


@pytest.fixture(scope="module")
def float32_run():
    """(model, weights after each update) of 5 float32 steps: fitted once for two tests."""
    return train_tiny(TrainingModel, "float32", 5)


def check_the_closed_form(model, history):
    averages = [v.numpy() for v in ema.averages(model.optimizer)]
    for got, want in zip(averages, closed_form(history, DECAY)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # fit leaves the raw weights in the model (Keras would overwrite them with the average)
    raw = [v.numpy() for v in model.transformer.trainable_variables]
    for got, want in zip(raw, history[-1]):
        np.testing.assert_array_equal(got, want)
    assert max(float(np.abs(a - b).max()) for a, b in zip(raw, averages)) > 1e-4


def test_the_average_after_n_updates_is_the_closed_form(float32_run):
    model, history = float32_run
    assert len(history) == 5
    check_the_closed_form(model, history)


class SkipFirstSteps(TrainingModel):
    """Non-finite gradients on the first 3 batches: float16 loss scaling skips those steps."""

    def compute_gradients(self, *args):
        grads, loss = super().compute_gradients(*args)
        poison = tf.where(self.data_position < 3, float("inf"), 0.0)
        return [grads[0] + poison, *grads[1:]], loss


def test_skipped_float16_steps_leave_the_average_and_train_steps_exact():
    """3 skipped float16 steps do not move the average, and `fit_to_step` still applies
    exactly --train-steps updates (it was test_trainer's float16 test: one fit for both)."""
    set_precision("mixed_float16")
    model = SkipFirstSteps(one_layer_transformer())
    model.compile(
        optimizer=kt.paper_optimizer(64, 10, ema_decay=DECAY), loss=kt.LabelSmoothedCrossEntropy()
    )
    recorder, state = Recorder(), cb.StepState(model)
    callbacks = [cb.NonFiniteLossGuard(None), cb.StopAtStep(state, 6), recorder]
    settings = TrainArgs(train_steps=6, steps_per_epoch=4, verbose=0)
    fit_to_step(model, lambda position: batches(), None, callbacks, settings)
    assert int(model.optimizer.iterations.numpy()) == 6  # exactly --train-steps updates
    assert int(model.data_position.numpy()) == 9  # 3 skipped batches + 6 applied
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**15 / 8
    assert len(recorder.weights) == 6  # the skipped steps recorded no update
    check_the_closed_form(model, recorder.weights)


def test_swapped_puts_the_raw_weights_back_bit_for_bit(float32_run):
    model, history = float32_run
    averages = [v.numpy() for v in ema.averages(model.optimizer)]
    with ema.swapped(model.transformer, model.optimizer):
        for variable, average in zip(model.transformer.trainable_variables, averages):
            np.testing.assert_array_equal(variable.numpy(), average)
    for variable, raw in zip(model.transformer.trainable_variables, history[-1]):
        np.testing.assert_array_equal(variable.numpy(), raw)


# -- train.py and export.py --------------------------------------------------------------------

RUN = ("--steps-per-epoch", "4", "--checkpoint-every", "2", "--eval-every", "4",
       "--log-every", "2", "--ema-decay", "0.9")  # fmt: skip


@pytest.fixture(scope="module")
def ema_runs(tmp_path_factory, multi30k_dir):
    """(12 steps with --ema-decay, the same 12 steps without it, the export folder), in one
    process tree: the two runs, then the first one's two exports by export.py, with and
    without --no-ema (`exports/ema`, `exports/raw`; no agreement report, test_export_formats
    checks it: the weights are what is compared). The resume of a run with --ema-decay is
    checked by test_trainer_kill (its two-corpora case), bit for bit."""
    base = tmp_path_factory.mktemp("ema")
    data = write_corpus(base / "data", multi30k_dir, 0, 600)
    alone, plain, exports = base / "alone", base / "plain", base / "exports"
    without = [f for f in RUN if f not in ("--ema-decay", "0.9")]
    run_commands(
        train_argv(alone, *data, *RUN, "--train-steps", "12"),
        train_argv(plain, *data, *without, "--train-steps", "12"),
        *(
            ["export.py", "--model-dir", alone, "--export-dir", exports / name,
             "--average-last", "1", "--agreement-sentences", "0", *flags]
            for name, flags in (("ema", []), ("raw", ["--no-ema"]))
        ),
    )  # fmt: skip
    return alone, plain, exports


def checkpoint_tensors(path) -> dict:
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.slow
def test_the_raw_weights_are_those_of_the_same_run_without_ema(ema_runs):
    """The average never feeds back: with --ema-decay, a run trains bit for bit the weights
    (and optimizer state, data position, RNG) of the same command without it, so one tuning
    run gives both the default recipe's weights (`export.py --no-ema`) and the average."""
    alone, plain, _ = ema_runs
    with_ema, without = (checkpoint_tensors(Run(str(d)).checkpoints()[-1]) for d in (alone, plain))
    averages = {n for n in with_ema if n.startswith(f"{EMA_KEY}/")}
    assert averages
    slots = "optimizer/_variables/"

    def split(tensors, leave_out=()):
        """(everything but the optimizer's numbered variables, those in their order)."""
        named = {n: v for n, v in tensors.items() if not n.startswith(slots)}
        numbered = sorted(
            (int(n[len(slots) :].split("/")[0]), n) for n in tensors if n.startswith(slots)
        )
        return {n: v for n, v in named.items() if n not in leave_out}, [
            tensors[n] for _, n in numbered
        ]

    # the optimizer numbers its copies of the averages first, so its own slots move up
    (named, slot_values), (want_named, want_slots) = split(with_ema, averages), split(without)
    assert set(named) == set(want_named) and len(slot_values) == len(want_slots)
    compared = [n for n in want_named if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    # validation scored the average in one run and the raw weights in the other
    compared = [n for n in compared if not n.startswith("bleu/")]
    assert any(n.startswith("model/") for n in compared)
    for name in compared:
        np.testing.assert_array_equal(named[name], want_named[name], err_msg=name)
    for i, (got, want) in enumerate(zip(slot_values, want_slots)):
        np.testing.assert_array_equal(got, want, err_msg=f"optimizer slot {i}")


def exported_arrays(path) -> list:
    reader = tf.train.load_checkpoint(f"{path}/variables/variables")
    names = [n for n in reader.get_variable_to_shape_map() if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return [reader.get_tensor(n) for n in names]


def contains(arrays, value) -> bool:
    return any(a.shape == value.shape and np.array_equal(a, value) for a in arrays)


@pytest.mark.slow
def test_export_takes_the_averages_unless_no_ema(ema_runs):
    run_dir, exports = str(ema_runs[0]), ema_runs[2]
    last = Run(run_dir).checkpoints()[-1]
    reader = tf.train.load_checkpoint(last)
    raw_model, _, _ = load_trained(run_dir, ema=False)
    averaged_model, _, _ = load_trained(run_dir)
    for i, variable in enumerate(averaged_model.trainable_variables):
        np.testing.assert_array_equal(
            variable.numpy(), reader.get_tensor(f"{EMA_KEY}/{i}/.ATTRIBUTES/VARIABLE_VALUE")
        )
    # the largest variable, the (V, d_model) embedding: compared with what export.py wrote
    embedding = int(np.argmax([np.prod(v.shape) for v in raw_model.trainable_variables]))
    raw = raw_model.trainable_variables[embedding].numpy()
    averaged = averaged_model.trainable_variables[embedding].numpy()
    assert float(np.abs(raw - averaged).max()) > 1e-4
    # export.py's two exports of the run (ema_runs), with and without --no-ema
    paths = {name: str(exports / name / "transformer" / "1") for name in ("ema", "raw")}
    ema_arrays, raw_arrays = exported_arrays(paths["ema"]), exported_arrays(paths["raw"])
    assert contains(ema_arrays, averaged) and not contains(ema_arrays, raw)
    assert contains(raw_arrays, raw) and not contains(raw_arrays, averaged)


@pytest.mark.slow
def test_best_holds_the_averaged_weights_that_were_validated(ema_runs):
    run = Run(str(ema_runs[0]))
    best = run.checkpoints(best=True)[-1]
    saved = run.path(f"checkpoints/ckpt-{best.rsplit('-', 1)[1]}")  # the same step's checkpoint
    assert saved in run.checkpoints()
    best_model, _ = run.load_model(best=True)
    reader = tf.train.load_checkpoint(saved)
    for i, variable in enumerate(best_model.trainable_variables):
        average = reader.get_tensor(f"{EMA_KEY}/{i}/.ATTRIBUTES/VARIABLE_VALUE")
        np.testing.assert_array_equal(variable.numpy(), average)
    raw_model, _ = run.load_model()
    run.restore_average(raw_model, [saved], ema=False)
    assert any(
        not np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(raw_model.trainable_variables, best_model.trainable_variables)
    )
