import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_dir import LOG_DIR, Run
from keras_transformer.settings.args import TrainArgs
from keras_transformer.training import callbacks as cb
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import set_precision
from keras_transformer.training.trainer import fit_to_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--preset",
    "tiny",
    "--vocab-size",
    "500",
    "--max-length",
    "32",
    "--batch-tokens",
    "512",
    "--eval-sentences",
    "8",
    "--eval-beam-size",
    "1",
    "--verbose",
    "0",
    "--log-every",
    "5",
]


def train_cmd(model_dir, data_dir, *extra):
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--data-dir",
        data_dir,
        "--model-dir",
        str(model_dir),
        *TINY,
        *extra,
    ]


def run_train(model_dir, data_dir, *extra, env=None, check=True):
    out = subprocess.run(
        train_cmd(model_dir, data_dir, *extra), capture_output=True, text=True, env=env, cwd=ROOT
    )
    if check and out.returncode != 0:
        raise AssertionError(out.stderr[-3000:])
    return out


def final_weights(model_dir):
    """(newest checkpoint, its model weights as a list of arrays)."""
    run = Run(str(model_dir))
    model, _ = run.load_model()
    return run.checkpoints()[-1], model.get_weights()


RESUME = [
    "--train-steps", "40", "--steps-per-epoch", "15", "--checkpoint-every", "10",
    "--warmup-steps", "10", "--eval-every", "5",
]  # fmt: skip


def events(run_dir):
    """[(event, step)] of metrics.jsonl, in order."""
    return [(r["event"], r["step"]) for r in Run(str(run_dir)).read_metrics()]


def tensorboard_steps(run_dir, tag="loss"):
    """The steps of the `tag` scalars in logs/train, in the order written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # as TensorBoard reads a directory: events a restarted run writes again replace those
    # the killed one wrote past its restored step (purge_orphaned_data)
    accumulator = EventAccumulator(str(run_dir / LOG_DIR / "train"))
    accumulator.Reload()
    return [event.step for event in accumulator.Tensors(tag)]


def two_corpora(multi30k_dir):
    """Multi30k and (as a second, tagged corpus) its validation files, mixed 3:1: the
    second corpus is read 7.5 times per epoch, so both stand mid-pass at most steps; with
    BPE-dropout on the training sentences."""
    val = [os.path.join(multi30k_dir, f"val.{lang}.gz") for lang in ("en", "de")]
    return [
        "--dataset", "multi30k,files", "--train-src", val[0], "--train-tgt", val[1],
        "--train-weights", "3,1", "--tag-corpus", "2", "--subword-alpha", "0.1",
    ]  # fmt: skip


KILLS = [("one", "25:batch"), ("one", "30:validation"), ("two", "30:epoch_end")]


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory, multi30k_dir):
    """The runs left alone, one per corpora setting, trained once for the kill tests."""
    runs = {}

    def run(corpora):
        if corpora not in runs:
            alone = tmp_path_factory.mktemp(f"alone-{corpora}")
            flags = RESUME + (two_corpora(multi30k_dir) if corpora == "two" else [])
            runs[corpora] = (alone, run_train(alone, multi30k_dir, *flags))
        return runs[corpora]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("corpora, kill", KILLS, ids=[f"{c}-{k}" for c, k in KILLS])
def test_resume_after_sigkill_is_exact(tmp_path, multi30k_dir, left_alone, corpora, kill):
    """Killed (os._exit at a given step and phase: $KT_KILL_AT) and started again == left
    alone: weights, best/, BLEU history, metrics events; mid-epoch, during the epoch-end
    validation and after the epoch-end work (step 30 ends epoch 2 and is a --checkpoint-every
    step: its checkpoint must come after that work); with one corpus, and with two mixed 3:1
    (one of them tagged) and subword sampling."""
    flags = RESUME + (two_corpora(multi30k_dir) if corpora == "two" else [])
    alone, out = left_alone(corpora)
    assert "training ended at step 40 of 40" in out.stdout
    assert corpora == "one" or "2 corpora" in out.stdout and "tagged <BT>" in out.stdout
    assert "ran out of data" not in out.stderr  # Keras stops after the last validation batch
    assert f"kt-export --model-dir {alone} --export-dir exports" in out.stdout

    model_dir = tmp_path / "killed"
    killed = run_train(model_dir, multi30k_dir, *flags, check=False,
                       env=dict(os.environ, KT_KILL_AT=kill))  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    killed_at = int(Run(str(model_dir)).checkpoints()[-1].rsplit("-", 1)[1])
    assert killed_at == 20  # the step-30 checkpoint follows the epoch-end work, never before
    config = Run(str(model_dir)).read_config()["training"]
    assert config["warmup_steps"] == 10 and config["steps_per_epoch"] == 15

    out = run_train(model_dir, multi30k_dir, *flags)
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
    # every event once, as the run left alone wrote them; time_s keeps counting
    assert events(model_dir) == events(alone)
    times = [r["time_s"] for r in Run(str(model_dir)).read_metrics()]
    assert times == sorted(times)
    # TensorBoard's step axis is the optimizer step across both processes
    assert tensorboard_steps(model_dir) == tensorboard_steps(alone) == list(range(5, 41, 5))
    records = Run(str(model_dir)).read_metrics()
    assert {"step", "epoch", "loss"} <= set(records[0]) and any("val_loss" in r for r in records)
    assert os.listdir(model_dir / LOG_DIR)  # TensorBoard logs
    # asking again for the same step count does nothing
    assert "already at step 40" in run_train(model_dir, multi30k_dir, *flags).stdout


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_leaves_no_event_twice(tmp_path, multi30k_dir):
    """Killed after the first epoch's end work (its events written) and before its
    checkpoint, the run restarts from nothing: each event and TensorBoard summary once."""
    flags = ["--train-steps", "5", "--steps-per-epoch", "5", "--eval-every", "5"]
    model_dir = tmp_path / "killed"
    killed = run_train(model_dir, multi30k_dir, *flags, check=False,
                       env=dict(os.environ, KT_KILL_AT="5:epoch_end"))  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert Run(str(model_dir)).checkpoints() == []
    assert events(model_dir) == [("train", 5), ("bleu", 5), ("epoch", 5)]
    run_train(model_dir, multi30k_dir, *flags)
    assert events(model_dir) == [("train", 5), ("bleu", 5), ("epoch", 5)]
    assert tensorboard_steps(model_dir) == [5]
    assert tensorboard_steps(model_dir, "epoch_loss") == [5]


def checkpoint_values(path, *keys):
    """The values of the checkpoint variables whose names contain each key, in order."""
    reader = tf.train.load_checkpoint(path)
    names = [n for n, _ in tf.train.list_variables(path)]
    return [float(reader.get_tensor(next(n for n in names if key in n))) for key in keys]


@pytest.mark.slow
def test_resume_restores_the_loss_scale(tmp_path, multi30k_dir):
    """A start scale of 2**30 overflows float16 gradients: the first run halves it (skipping
    those batches) before its updates; the resumed run starts from the saved, lower scale
    and skips nothing. Restarted from 2**30, it would skip the same batches again."""
    model_dir = tmp_path / "fp16"
    args = ["--precision", "mixed_float16", "--initial-loss-scale", str(2**30)]
    args += ["--cpu-devices", "1"]  # float16 on the CPU, asked for explicitly
    args += ["--steps-per-epoch", "40", "--eval-every", "100"]
    run_train(model_dir, multi30k_dir, "--train-steps", "10", *args)
    first = Run(str(model_dir)).checkpoints()[-1]
    saved, position = checkpoint_values(first, "dynamic_scale", "data_position")
    assert saved < 2**30 and position > 10  # overflows halved the scale, skipped batches
    out = run_train(model_dir, multi30k_dir, "--train-steps", "12", *args)
    assert f"at step 10 (loss scale {saved:g})" in out.stdout
    last = Run(str(model_dir)).checkpoints()[-1]
    assert checkpoint_values(last, "dynamic_scale", "data_position") == [saved, position + 2]


@pytest.mark.slow
def test_resume_refuses_flags_that_would_change_the_run(tmp_path, multi30k_dir):
    model_dir = tmp_path / "run"
    out = run_train(model_dir, multi30k_dir, "--train-steps", "2", "--warmup-steps", "30")
    assert "settings (config.json):" in out.stdout  # logged at INFO, the default --log-level
    for flag, value, saved in (
        ("--warmup-steps", "50", "30"),
        ("--dropout-rate", "0.3", "0.2"),
        ("--precision", "mixed_float16", "float32"),
    ):
        out = run_train(model_dir, multi30k_dir, "--train-steps", "4", flag, value, check=False)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"{flag} {value} differs from {saved} in {model_dir}/config.json" in out.stderr
    # flags that only continue the run are fine; --log-level WARNING hides the INFO lines,
    # not the command's output (the summary)
    out = run_train(
        model_dir, multi30k_dir, "--train-steps", "3", "--warmup-steps", "30",
        "--log-level", "WARNING",
    )  # fmt: skip
    assert "training ended at step 3 of 3" in out.stdout
    assert "settings (config.json):" not in out.stdout and "resumed from" not in out.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(model_dir, data_dir, *args, timeout=420):
    """Two local workers of one MultiWorkerMirroredStrategy job; their stdout."""
    workers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(
            subprocess.Popen(
                train_cmd(model_dir, data_dir, "--strategy", "multi_worker", *args),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, TF_CONFIG=json.dumps(config)),
                cwd=ROOT,
            )
        )
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError("a worker hung (blocked in a collective?)") from None
        assert proc.returncode == 0, err[-3000:]
        outputs.append(out)
    return outputs


def assert_same_variables(first, second, tolerance=0.0):
    """Every saved weight (some stored under the optimizer's references) and slot is equal
    (to `tolerance`, relative to the largest value of the variable)."""
    a, b = tf.train.load_checkpoint(first), tf.train.load_checkpoint(second)
    names = [n for n, _ in tf.train.list_variables(first) if n.startswith(("model/", "optimizer/"))]
    assert len(names) > 100
    for name in names:
        x, y = a.get_tensor(name), b.get_tensor(name)
        scale = max(float(np.max(np.abs(x))), 1e-6) if np.size(x) else 1.0
        assert float(np.max(np.abs(x - y), initial=0.0)) <= tolerance * scale, name


@pytest.mark.slow
def test_multi_worker_two_processes(tmp_path, multi30k_dir):
    """Two local workers: the non-chief waits for the chief's tokenizer, and early stopping
    on patience stops both at the same step (a chief-only decision would leave worker 1
    blocked in a collective). Only the chief writes: no worker_1 directory, no dead
    checkpoints. Each worker reads its own share of the pairs (pairs w, w + 2, ...)."""
    model_dir = tmp_path / "mw"
    args = ["--train-steps", "12", "--steps-per-epoch", "6", "--checkpoint-every", "3",
            "--eval-every", "3", "--patience", "1"]  # fmt: skip
    outputs = run_workers(model_dir, multi30k_dir, *args)
    assert "early stopping" in outputs[0]
    for w, out in enumerate(outputs):
        assert f"worker input: pairs {w}, {w} + 2, ... of every pass (share {w + 1} of 2)" in out
    assert not os.path.exists(model_dir / "worker_1")  # the chief's tokenizer is used
    stop = int(Run(str(model_dir)).checkpoints()[-1].rsplit("-", 1)[1])
    assert stop < 12


def test_a_worker_that_gives_up_stops_the_chief(tmp_path):
    from keras_transformer.settings.args import ConfigError
    from keras_transformer.training.preparation import GAVE_UP, check_workers, wait_for

    run_dir = Run(str(tmp_path))
    check_workers(run_dir)  # nothing to report
    note = run_dir.path(GAVE_UP.format(1))
    with pytest.raises(ConfigError, match=r"waited 0 s \(--worker-wait\) for the chief"):
        wait_for(run_dir.path("config.json"), 0, note)
    assert os.path.isfile(note)
    with pytest.raises(ConfigError, match=r"worker_1 gave up waiting for this chief"):
        check_workers(run_dir)
    check_workers(run_dir)  # the note is cleared: the next start begins clean


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize(
    "case,expected",
    [
        ("mismatch", r"a\.en has 3 lines, .*b\.de has 2 lines"),
        ("missing", r"file not found: .*missing\.en"),
        ("no_multi30k", r"train\.en\(\.gz\) not found in: .*empty"),
        ("batch_tokens", r"--batch-tokens must be a positive integer, got 0"),
        ("max_length", r"--max-length must be a positive integer, got -5"),
        ("dataset", r"unknown --dataset 'wmt99'"),
        ("dropout", r"--dropout-rate must be in \[0, 1\), got 1\.5"),
        ("lr_scale", r"--lr-scale must be positive, got -1\.0"),
        ("steps", r"give --epochs or --train-steps, not both"),
    ],
)
def test_bad_input_gives_a_clear_message(tmp_path, case, expected, multi30k_dir):
    src = write(tmp_path / "a.en", ["one", "two", "three"])
    tgt = write(tmp_path / "b.de", ["eins", "zwei"])
    args = {
        "mismatch": [
            "--dataset",
            "files",
            "--train-src",
            src,
            "--train-tgt",
            tgt,
            "--valid-src",
            src,
            "--valid-tgt",
            tgt,
        ],
        "missing": [
            "--dataset",
            "files",
            "--train-src",
            str(tmp_path / "missing.en"),
            "--train-tgt",
            tgt,
            "--valid-src",
            src,
            "--valid-tgt",
            tgt,
        ],
        "no_multi30k": ["--data-dir", str(tmp_path / "empty")],
        "batch_tokens": ["--batch-tokens", "0"],
        "max_length": ["--max-length", "-5"],
        "dataset": ["--dataset", "wmt99"],
        "dropout": ["--dropout-rate", "1.5"],
        "lr_scale": ["--lr-scale", "-1"],
        "steps": ["--epochs", "2", "--train-steps", "5"],
    }[case]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), KT_OFFLINE="1")
    out = subprocess.run(
        train_cmd(tmp_path / "run", multi30k_dir, *args),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    import re

    assert re.search(expected, out.stderr), out.stderr[-2000:]


class SkipFirstSteps(TrainingModel):
    """Non-finite gradients on the first 3 batches: float16 loss scaling skips those steps."""

    def compute_gradients(self, *args):
        grads, loss = super().compute_gradients(*args)
        poison = tf.where(self.data_position < 3, float("inf"), 0.0)
        return [grads[0] + poison, *grads[1:]], loss


def test_train_steps_is_exact_when_float16_steps_are_skipped():
    set_precision("mixed_float16")
    transformer = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=40))
    model = SkipFirstSteps(transformer)
    model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
    rng = np.random.default_rng(0)
    src = rng.integers(4, 40, size=(4, 7)).astype("int32")
    tgt = rng.integers(4, 40, size=(4, 6)).astype("int32")
    data = tf.data.Dataset.from_tensors(((src, tgt), tgt)).repeat()
    state = cb.StepState(model)
    callbacks = [cb.NonFiniteLossGuard(None), cb.StopAtStep(state, 6)]
    settings = TrainArgs(train_steps=6, steps_per_epoch=4, verbose=0)
    fit_to_step(model, lambda position: data, None, callbacks, settings)
    assert int(model.optimizer.iterations.numpy()) == 6  # exactly --train-steps updates
    assert int(model.data_position.numpy()) == 9  # 3 skipped batches + 6 applied
    assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**15 / 8
