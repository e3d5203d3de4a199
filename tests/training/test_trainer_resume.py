"""kt-train started again on a run directory: the float16 loss scale carries over, a run
killed before its first checkpoint restarts from nothing, and a flag that would change the
run is refused (training.trainer). On a Multi30k folder of 400 training pairs
(mini_multi30k_dir)."""

import contextlib
import logging

import pytest

from keras_transformer.cli.train import main
from keras_transformer.run_dir import Run
from tests.training.small_corpus import run_commands
from tests.training.trainer_runs import (
    checkpoint_values,
    events,
    tensorboard_steps,
    train_cmd,
)


@contextlib.contextmanager
def command_logging():
    """kt-train's main configures the package logger for a process of its own: put it back."""
    logger = logging.getLogger("keras_transformer")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    try:
        yield
    finally:
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


@pytest.mark.slow
def test_resume_restores_the_loss_scale(tmp_path, mini_multi30k_dir):
    """A start scale of 2**24 overflows float16 gradients: the first run halves it (skipping
    those batches) before its updates; the resumed run starts from the saved, lower scale
    and skips nothing. Restarted from 2**24, it would skip the same batches again."""
    model_dir = tmp_path / "fp16"
    args = ["--precision", "mixed_float16", "--initial-loss-scale", str(2**24)]
    args += ["--cpu-devices", "1"]  # float16 on the CPU, asked for explicitly
    args += ["--steps-per-epoch", "40", "--eval-every", "100"]
    # the run and its resume in one process tree (one import of TensorFlow)
    _, out = run_commands(
        train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "2", *args)[1:],
        train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "4", *args)[1:],
    )
    checkpoints = Run(str(model_dir)).checkpoints()
    first, last = next(c for c in checkpoints if c.endswith("-2")), checkpoints[-1]
    saved, position = checkpoint_values(first, "dynamic_scale", "data_position")
    assert saved < 2**24 and position > 2  # overflows halved the scale, skipped batches
    assert f"at step 2 (loss scale {saved:g})" in out.stdout
    assert checkpoint_values(last, "dynamic_scale", "data_position") == [saved, position + 2]


@pytest.mark.slow
def test_a_kill_before_the_first_checkpoint_then_flags_that_would_change_the_run(
    tmp_path, mini_multi30k_dir, capsys
):
    """Killed after the first epoch's end work (its events written) and before its
    checkpoint, the run restarts from nothing: each event and TensorBoard summary once. On
    that run directory, a flag that would change the run is refused; flags that only
    continue it are fine (one chain of starts: the kill test moved here from
    test_trainer_kill, so that the refusals need no run of their own)."""
    flags = ["--steps-per-epoch", "5", "--eval-every", "5", "--warmup-steps", "30"]
    model_dir, as_killed, restarted = (tmp_path / n for n in ("killed", "as-killed", "restarted"))
    copy = tmp_path / "copy.py"  # keeps the run directory as the kill, then the restart left it
    copy.write_text("import shutil, sys\nshutil.copytree(sys.argv[1], sys.argv[2])\n")
    # the three kt-train commands of this test in one process tree (one import of TensorFlow)
    killed, _, out, _, last = run_commands(
        train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "5", *flags)[1:],
        [copy, model_dir, as_killed],
        train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "5", *flags)[1:],
        [copy, model_dir, restarted],
        train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "6", *flags,
                  "--log-level", "WARNING")[1:],
        envs=[{"KT_KILL_AT": "5:epoch_end"}, None, None, None, None],
        check=False,
    )  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert Run(str(as_killed)).checkpoints() == []
    assert events(as_killed) == [("train", 5), ("bleu", 5), ("epoch", 5)]
    assert out.returncode == 0 and last.returncode == 0, out.stderr[-3000:] + last.stderr[-3000:]
    assert events(restarted) == [("train", 5), ("bleu", 5), ("epoch", 5)]
    assert tensorboard_steps(restarted) == [5]
    assert tensorboard_steps(restarted, "epoch_loss") == [5]

    assert "settings (config.json):" in out.stdout  # logged at INFO, the default --log-level
    # the refusals: kt-train's main in this process (the command line train.py runs, its
    # exit status and stderr; no process of its own, as they stop before any training)
    for flag, value, saved in (
        ("--warmup-steps", "50", "30"),
        ("--dropout-rate", "0.3", "0.2"),
        ("--precision", "mixed_float16", "float32"),
    ):
        argv = train_cmd(model_dir, mini_multi30k_dir, "--train-steps", "6", flag, value)[2:]
        with command_logging():
            status = main(argv, prog="train.py")
        err = capsys.readouterr().err
        assert status == 2 and "Traceback" not in err
        assert f"{flag} {value} differs from {saved} in {model_dir}/config.json" in err
        assert err.startswith("train.py: error: ") and len(err.strip().splitlines()) == 1
    # flags that only continue the run are fine; --log-level WARNING hides the INFO lines,
    # not the command's output (the summary)
    assert "training ended at step 6 of 6" in last.stdout
    assert "settings (config.json):" not in last.stdout and "resumed from" not in last.stdout
