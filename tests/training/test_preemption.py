import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from keras_transformer.cli.common import RUNTIME_LOG
from keras_transformer.run_dir import Run
from keras_transformer.training.callbacks import KILL_AT_ENV
from keras_transformer.training.preemption import EXIT_CODE, Preempted, PreemptionSave
from tests.training.small_corpus import ROOT, TINY, write_corpus
from tests.training.test_trainer import assert_same_variables


def test_sigterm_on_one_machine_saves_after_the_next_batch_and_exits_143():
    position, saved = [0], []
    previous = signal.getsignal(signal.SIGTERM)

    def save():
        saved.append(position[0])
        return f"ckpt-{position[0]}"

    callback = PreemptionSave(tf.distribute.get_strategy(), lambda: position[0], save)
    try:
        for batch in range(1, 4):
            position[0] = batch
            callback.on_train_batch_end(batch)
        assert saved == []  # no signal, no save
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the process lives on
        position[0] = 4
        callback.on_train_batch_end(4)  # the target: after batch 5
        assert saved == []
        position[0] = 5
        with pytest.raises(Preempted) as stopped:
            callback.on_train_batch_end(5)
        assert stopped.value.code == EXIT_CODE == 143
        assert saved == [5] and "ckpt-5" in stopped.value.message
        assert signal.getsignal(signal.SIGTERM) == previous  # restored on the way out
    finally:
        callback.close()
        signal.signal(signal.SIGTERM, previous)


def test_close_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGTERM)
    callback = PreemptionSave(tf.distribute.get_strategy(), lambda: 0, lambda: None)
    assert signal.getsignal(signal.SIGTERM) != previous
    callback.close()
    assert signal.getsignal(signal.SIGTERM) == previous


# -- whole runs: a signal at a set step and phase ($KT_KILL_AT=STEP:PHASE:SIGNAL) ------------

FLAGS = ["--train-steps", "30", "--steps-per-epoch", "10", "--checkpoint-every", "5",
         "--eval-every", "1000", "--warmup-steps", "10", "--log-every", "5"]  # fmt: skip


def run(model_dir, corpus, *extra, env=None):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--model-dir", str(model_dir)]
        + [*TINY, *corpus, *FLAGS, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, multi30k_dir):
    return write_corpus(tmp_path_factory.mktemp("corpus"), multi30k_dir, 0, 400)


@pytest.fixture(scope="module")
def alone(tmp_path_factory, corpus):
    """The run left alone."""
    model_dir = tmp_path_factory.mktemp("alone")
    out = run(model_dir, corpus)
    assert out.returncode == 0, out.stderr[-3000:]
    return model_dir


def events(model_dir):
    return [(r["event"], r["step"]) for r in Run(str(model_dir)).read_metrics()]


# (where the signal arrives, the step of the preemption checkpoint), in the order one chain
# of restarts meets them: during the epoch-end validation (one machine: saved at that
# epoch's end), the batch before an epoch's last one (the save falls on the last batch:
# after the epoch-end work), inside step 25's checkpoint save, mid-epoch (its data files
# written, its state file not yet: that save completes, the preemption saves after the next
# batch, 26, and the run resumes mid-epoch from there: what a plain mid-epoch signal, once
# at 6:batch here, proved too)
SIGNALS = [("10:validation", 10), ("19:batch", 20), ("25:save", 26)]


@pytest.mark.slow
def test_sigterm_at_any_step_resumes_bit_for_bit(tmp_path, corpus, alone):
    """SIGTERM at a set step and phase: exit 143 with a checkpoint at `saved`, after that
    step's epoch-end work when the step ends an epoch, after the interrupted save (complete,
    restorable) when the signal lands inside one; the same command again resumes there
    (each restart but the last is signalled at the next point of SIGNALS) and ends with the
    weights and optimizer slots of the run left alone, bit for bit, and metrics.jsonl holds
    every event (each epoch's end) exactly once, as the run left alone wrote them."""
    model_dir = tmp_path / "preempted"
    previous = None
    for at, saved in SIGNALS:
        out = run(model_dir, corpus, env={KILL_AT_ENV: f"{at}:SIGTERM"})
        assert out.returncode == 143, out.stderr[-3000:]
        assert "Traceback" not in out.stderr
        assert previous is None or f"at step {previous}" in out.stdout  # resumed there
        assert f"checkpoint {model_dir}/checkpoints/ckpt-{saved} written" in out.stdout
        assert [p.rsplit("-", 1)[1] for p in Run(str(model_dir)).checkpoints()][-1] == str(saved)
        if saved % 10 == 0:  # the epoch's end was done before the exit, once
            assert events(model_dir).count(("epoch", saved)) == 1
        if at.endswith(":save"):  # the save the signal interrupted is complete
            assert f"ckpt-{saved - 1}" in Run(str(model_dir)).checkpoints()[-2]
            said = (out.stdout + out.stderr).splitlines()
            assert len([line for line in said if "stopped by SIGTERM" in line]) == 1
        previous = saved
    out = run(model_dir, corpus)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"at step {previous}" in out.stdout
    assert events(model_dir) == events(alone)
    final = [Run(str(d)).checkpoints()[-1] for d in (alone, model_dir)]
    assert final[0].endswith("ckpt-30") and final[1].endswith("ckpt-30")
    assert_same_variables(final[0], final[1], tolerance=0.0)


@pytest.mark.slow
def test_ctrl_c_saves_says_one_line_and_exits_130(tmp_path, corpus):
    """Ctrl-C (SIGINT from another process, once training runs): a checkpoint, at most one
    line on stderr (the stop is logged), no traceback, exit 130; the same command resumes from that checkpoint."""
    model_dir = tmp_path / "interrupted"
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--model-dir", str(model_dir)]
    command += [*TINY, *corpus, *FLAGS[2:], "--train-steps", "100000", "--log-every", "1"]
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    try:
        deadline = time.time() + 240
        while not [r for r in Run(str(model_dir)).read_metrics() if r["step"] >= 2]:
            assert proc.poll() is None and time.time() < deadline, "no training step"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    # TensorFlow's C++ log lines aside (RUNTIME_LOG: e.g. a failed cuInit on a machine with
    # no GPU), stderr holds at most one line: no warning, no traceback (the stop is logged)
    lines = [line for line in err.splitlines() if line.strip() and not RUNTIME_LOG.match(line)]
    assert "Traceback" not in err and len(lines) <= 1, err
    saved = Run(str(model_dir)).checkpoints()
    assert saved and f"checkpoint {saved[-1]} written" in out + err
    assert "stopped by SIGINT" in out + err


def test_sigint_is_handled_like_sigterm_and_a_second_one_interrupts():
    position, saved = [0], []
    previous = signal.getsignal(signal.SIGINT)

    def save():
        saved.append(position[0])
        return f"ckpt-{position[0]}"

    callback = PreemptionSave(tf.distribute.get_strategy(), lambda: position[0], save)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt
        position[0] = 1
        callback.on_train_batch_end(0)
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        position[0] = 2
        with pytest.raises(Preempted) as stopped:
            callback.on_train_batch_end(1)
        assert stopped.value.code == 130 and saved == [2]
        assert "stopped by SIGINT" in stopped.value.message
        assert signal.getsignal(signal.SIGINT) == previous
    finally:
        callback.close()
        signal.signal(signal.SIGINT, previous)


class FakeModel:
    stop_training = False


def test_a_save_on_an_epochs_last_batch_waits_for_the_epoch_end():
    """The target batch ends the epoch (or the run): no save at the batch end, the save and
    the exit come at the epoch's end, after the callbacks before this one did their work."""
    position, saved = [0], []
    callback = PreemptionSave(
        tf.distribute.get_strategy(), lambda: position[0], lambda: saved.append(position[0])
    )
    callback.set_model(FakeModel())
    callback.set_params({"steps": 5})
    try:
        position[0] = 4
        os.kill(os.getpid(), signal.SIGTERM)
        callback.on_train_batch_end(3)  # target: after batch 5, the epoch's last
        position[0] = 5
        callback.on_train_batch_end(4)
        assert saved == []
        with pytest.raises(Preempted):
            callback.on_epoch_end(0)
        assert saved == [5]
    finally:
        callback.close()
