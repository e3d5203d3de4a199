import logging
import os
import re
import subprocess
import sys
import types

import pytest

from keras_transformer.training.progress import ProgressLog, duration
from keras_transformer.training.trainer import fit_verbosity
from tests.training.small_corpus import ROOT, TINY, write_corpus


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def driven(first_step: int, total: int, every: int, epochs, clock: Clock, seconds=(2.0, 1.0)):
    """Drives a ProgressLog through `epochs` (lists of the tokens of each step; one `fit` per
    epoch, as `fit_to_step` may do): each step takes `seconds[0]` of training, then
    `seconds[1]` of other callbacks' work."""
    state = types.SimpleNamespace(step=first_step)
    optimizer = types.SimpleNamespace(learning_rate=3.1e-4)
    counted = {"tokens": 0.0}
    callback = ProgressLog(state, total, every, clock=clock, count=lambda m: counted["tokens"])
    callback.set_model(types.SimpleNamespace(optimizer=optimizer))
    for tokens in epochs:
        callback.set_params({"steps": len(tokens)})
        callback.on_train_begin()
        counted["tokens"] = 0.0  # Keras resets the metrics, then calls on_epoch_begin
        callback.on_epoch_begin(0)
        for batch, step_tokens in enumerate(tokens):
            callback.on_train_batch_begin(batch)
            clock.now += seconds[0]
            state.step += 1
            counted["tokens"] += step_tokens
            callback.on_train_batch_end(batch, {"loss": 10.0 / state.step})
            clock.now += seconds[1]
    return callback


def test_a_line_every_n_steps_with_loss_lr_tokens_per_second_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="keras_transformer.training.progress")
    # 10 steps in two epochs of 5; step i has 100 * i target tokens
    epochs = [[100, 200, 300, 400, 500], [600, 700, 800, 900, 1000]]
    driven(0, 10, 4, epochs, Clock())
    assert caplog.messages == [
        # 1,000 tokens in 4 x 2 s of training; 11 s for 4 of 10 steps: 16.5 s left
        "step 4/10 | loss 2.500 | lr 3.10e-04 | 125 tok/s | elapsed 11s | ETA 16s",
        # steps 5 to 8 across the epoch boundary: 500 + 600 + 700 + 800 tokens in 8 s
        "step 8/10 | loss 1.250 | lr 3.10e-04 | 325 tok/s | elapsed 23s | ETA 6s",
        # the last step always has its line
        "step 10/10 | loss 1.000 | lr 3.10e-04 | 475 tok/s | elapsed 29s | ETA 0s",
    ]


def test_a_resumed_run_counts_the_eta_from_its_own_steps(caplog):
    caplog.set_level(logging.INFO, logger="keras_transformer.training.progress")
    driven(1000, 4000, 1000, [[50] * 1000], Clock(), seconds=(1.5, 0.5))
    # 1,999.5 s for the 1,000 steps of this process (the 1,000 before are not counted):
    # 2,000 steps left, 3,999 s
    assert caplog.messages == [
        "step 2000/4000 | loss 0.005 | lr 3.10e-04 | 33 tok/s | elapsed 33m20s | ETA 1h06m39s"
    ]


def test_duration():
    assert [duration(s) for s in (0, 7, 125, 3723)] == ["0s", "7s", "2m05s", "1h02m03s"]


@pytest.mark.parametrize(
    "verbose, terminal, expected", [(None, True, 1), (None, False, 2), (0, False, 0), (1, False, 1)]
)
def test_lines_replace_the_progress_bar_off_a_terminal(monkeypatch, verbose, terminal, expected):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    assert fit_verbosity(types.SimpleNamespace(verbose=verbose)) == expected


LINE = re.compile(
    r"step (\d+)/8 \| loss \d+\.\d{3} \| lr \d\.\d\de-\d\d \| [\d,]+ tok/s \| "
    r"elapsed \d+s \| ETA \d+s$"
)


@pytest.mark.slow
def test_kt_train_logs_progress_lines_when_stdout_is_a_pipe(tmp_path, multi30k_dir):
    data = write_corpus(tmp_path / "data", multi30k_dir, 0, 300)
    tiny = [f for f in TINY if f not in ("--verbose", "0")]  # the default: no --verbose
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "train.py"), "--model-dir", str(tmp_path / "run"),
         *tiny, *data, "--train-steps", "8", "--log-every", "4", "--steps-per-epoch", "6",
         "--eval-every", "8", "--checkpoint-every", "8"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    matches = [LINE.search(line) for line in out.stdout.splitlines()]
    assert [int(m.group(1)) for m in matches if m] == [4, 8]
    assert "ETA 0s" in out.stdout
