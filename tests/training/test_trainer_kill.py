"""kt-train killed (os._exit through the $KT_KILL_AT test hook) and started again: the
resumed run equals the run left alone (training.trainer, training.callbacks). On a Multi30k
folder of 400 training pairs (mini_multi30k_dir): several passes in 40 steps. The resume of
a run with --ema-decay is checked here too (the two-corpora case)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.run_dir import EMA_KEY, LOG_DIR, Run, load_trained
from tests.training.trainer_runs import (
    assert_same_variables,
    checkpoint_values,
    events,
    final_weights,
    run_train,
    tensorboard_steps,
)

RESUME = [
    "--train-steps", "40", "--steps-per-epoch", "15", "--checkpoint-every", "10",
    "--warmup-steps", "10", "--eval-every", "5",
]  # fmt: skip


def two_corpora(mini_multi30k_dir):
    """Multi30k and (as a second, tagged corpus) its validation files, mixed 3:1: on the mini
    folder each corpus runs through several passes in 40 steps, so both stand mid-pass at
    most steps; with BPE-dropout on the training sentences."""
    val = [os.path.join(mini_multi30k_dir, f"val.{lang}.gz") for lang in ("en", "de")]
    return [
        "--dataset", "multi30k,files", "--train-src", val[0], "--train-tgt", val[1],
        "--train-weights", "3,1", "--tag-corpus", "2", "--subword-alpha", "0.1",
    ]  # fmt: skip


# (corpora, the kills: each restart from the step-20 checkpoint, the last run to the end):
# during the epoch-end validation with one corpus; after the epoch-end work with two corpora
# and --ema-decay (the average, a variable of the optimizer, resumes exactly too). Both kills
# fall mid-way between two checkpoints and restart mid-epoch (epoch 2 is steps 16-30); a kill
# at 30:validation leaves behind all that one at 25:batch did (the step-25 events, TensorBoard
# summaries past step 20) and more, so the chain of two kills, 25:batch then 30:validation,
# is one kill now (a chain of restarts is test_preemption's)
KILLS = [("one", ("30:validation",)), ("two", ("30:epoch_end",))]
EMA = ["--ema-decay", "0.9"]


def flags_of(corpora, mini_multi30k_dir):
    return RESUME + (two_corpora(mini_multi30k_dir) + EMA if corpora == "two" else [])


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory, mini_multi30k_dir):
    """The runs left alone, one per corpora setting, trained once for the kill tests."""
    runs = {}

    def run(corpora):
        if corpora not in runs:
            alone = tmp_path_factory.mktemp(f"alone-{corpora}")
            flags = flags_of(corpora, mini_multi30k_dir)
            runs[corpora] = (alone, run_train(alone, mini_multi30k_dir, *flags))
        return runs[corpora]

    return run


def checkpoint_tensors(path) -> dict:
    reader = tf.train.load_checkpoint(path)
    names = [n for n in reader.get_variable_to_shape_map() if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.slow
@pytest.mark.parametrize("corpora, kills", KILLS, ids=[c for c, _ in KILLS])
def test_resume_after_sigkill_is_exact(tmp_path, mini_multi30k_dir, left_alone, corpora, kills):
    """Killed (os._exit at a given step and phase: $KT_KILL_AT) and started again == left
    alone: weights, best/, BLEU history, metrics events; restarted mid-epoch (from step 20),
    killed during the epoch-end validation and after the epoch-end work (step 30 ends epoch 2 and is a --checkpoint-every
    step: its checkpoint must come after that work); with one corpus, and with two mixed 3:1
    (one of them tagged), subword sampling and the weights' moving average."""
    flags = flags_of(corpora, mini_multi30k_dir)
    alone, out = left_alone(corpora)
    assert "training ended at step 40 of 40" in out.stdout
    assert corpora == "one" or "2 corpora" in out.stdout and "tagged <BT>" in out.stdout
    assert "ran out of data" not in out.stderr  # Keras stops after the last validation batch
    assert f"kt-export --model-dir {alone} --export-dir exports" in out.stdout

    model_dir = tmp_path / "killed"
    for kill in kills:
        killed = run_train(model_dir, mini_multi30k_dir, *flags, check=False,
                           env=dict(os.environ, KT_KILL_AT=kill))  # fmt: skip
        assert killed.returncode == 137, killed.stderr[-3000:]
        killed_at = int(Run(str(model_dir)).checkpoints()[-1].rsplit("-", 1)[1])
        assert killed_at == 20  # the step-30 checkpoint follows the epoch-end work, never before
        config = Run(str(model_dir)).read_config()["training"]
        assert config["warmup_steps"] == 10 and config["steps_per_epoch"] == 15

    out = run_train(model_dir, mini_multi30k_dir, *flags)
    assert f"at step {killed_at}" in out.stdout
    path, resumed = final_weights(model_dir)
    alone_path, reference = final_weights(alone)
    assert path.endswith("ckpt-40") and alone_path.endswith("ckpt-40")
    assert len(reference) > 20 and len(resumed) == len(reference)
    for index, (value, got) in enumerate(zip(reference, resumed)):
        assert np.array_equal(got, value), index  # one process: bit for bit
    assert_same_variables(path, alone_path, tolerance=0.0)  # every weight and optimizer slot
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("data_position/.ATTRIBUTES/VARIABLE_VALUE") == 40
    if corpora == "two":  # every saved tensor, the averages included (test_ema's resume)
        want, got = checkpoint_tensors(alone_path), checkpoint_tensors(path)
        averaged = [n for n in want if n.startswith(f"{EMA_KEY}/")]
        assert len(averaged) == len(load_trained(str(alone))[0].trainable_variables)
        assert set(got) == set(want)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
    # the best checkpoint and the BLEU history survive the kill: same best step, same scores
    best = [Run(str(d)).checkpoints(best=True)[-1].rsplit("-", 1)[1] for d in (alone, model_dir)]
    assert best[0] == best[1]
    assert checkpoint_values(Run(str(model_dir)).checkpoints()[-1], "bad_evals") == (
        checkpoint_values(alone_path, "bad_evals")
    )

    def bleus(run_dir):
        return {
            r["step"]: r["val_bleu"] for r in Run(str(run_dir)).read_metrics() if "val_bleu" in r
        }

    assert bleus(model_dir) == bleus(alone)
    # every BLEU in TensorBoard too, on disk when the process ended (kt-train's os._exit)
    for run_dir in (alone, model_dir):
        assert tensorboard_steps(run_dir, "bleu", "validation") == sorted(bleus(alone))
    # every event once, as the run left alone wrote them; time_s keeps counting
    assert events(model_dir) == events(alone)
    times = [r["time_s"] for r in Run(str(model_dir)).read_metrics()]
    assert times == sorted(times)
    # TensorBoard's step axis is the optimizer step across both processes
    assert tensorboard_steps(model_dir) == tensorboard_steps(alone) == list(range(5, 41, 5))
    records = Run(str(model_dir)).read_metrics()
    assert {"step", "epoch", "loss"} <= set(records[0]) and any("val_loss" in r for r in records)
    assert os.listdir(model_dir / LOG_DIR)  # TensorBoard logs
    if corpora == "one":  # asking again for the same step count does nothing (once is enough)
        assert "already at step 40" in run_train(model_dir, mini_multi30k_dir, *flags).stdout
