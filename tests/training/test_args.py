import dataclasses
import os
import sys

import pytest

from keras_transformer.training.args import (
    ConfigError,
    TrainArgs,
    check_resume,
    resolve,
    validate,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import train  # noqa: E402


def never(*_):
    raise AssertionError("batches_per_pass must not be called when --steps-per-epoch is set")


def test_the_command_line_is_built_from_train_args(monkeypatch):
    monkeypatch.delenv("KT_DATA_DIR", raising=False)
    assert train.parse_args([]) == TrainArgs()
    args = train.parse_args(["--warmup-steps", "800", "--lr-scale", "0.5", "--jit-compile"])
    assert (args.warmup_steps, args.lr_scale, args.jit_compile) == (800, 0.5, True)
    for field in dataclasses.fields(TrainArgs):  # every field is a flag with help
        assert field.metadata["help"], field.name
    with pytest.raises(SystemExit):
        train.parse_args(["--preset", "huge"])


def test_small_corpus_gets_the_multi30k_recipe():
    calls = []

    def batches_per_pass(vocab_size, batch_tokens):
        calls.append((vocab_size, batch_tokens))
        return 110

    out = resolve(TrainArgs(), num_pairs=29_000, batches_per_pass=batches_per_pass)
    assert calls == [(8000, 4096)]
    assert (out.vocab_size, out.batch_tokens, out.steps_per_epoch) == (8000, 4096, 110)
    assert out.train_steps == 20 * 110
    assert out.warmup_steps == 900 and isinstance(out.warmup_steps, int)  # 40%, to 100
    assert (out.lr_scale, out.dropout_rate, out.label_smoothing) == (0.8, 0.2, 0.1)
    assert out.checkpoint_every == 100 and out.eval_every == 220 and out.eval_sentences == 500


def test_large_corpus_gets_the_papers_recipe():
    for preset, steps, dropout in (("base", 100_000, 0.1), ("big", 300_000, 0.3)):
        args = TrainArgs(preset=preset, steps_per_epoch=1000)
        out = resolve(args, num_pairs=4_500_000, batches_per_pass=never)
        assert (out.vocab_size, out.batch_tokens) == (37000, 25000)
        assert (out.train_steps, out.warmup_steps, out.lr_scale) == (steps, 4000, 1.0)
        assert (out.dropout_rate, out.label_smoothing) == (dropout, 0.1)


def test_user_values_win_over_automatic_ones():
    args = TrainArgs(warmup_steps=123, lr_scale=2.0, dropout_rate=0.0, epochs=3, steps_per_epoch=7)
    out = resolve(args, num_pairs=29_000, batches_per_pass=never)
    assert (out.warmup_steps, out.lr_scale, out.dropout_rate) == (123, 2.0, 0.0)
    assert out.train_steps == 21 and out.epochs is None


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"dropout_rate": 1.5}, r"--dropout-rate must be in \[0, 1\), got 1\.5"),
        ({"label_smoothing": -0.1}, r"--label-smoothing must be in \[0, 1\)"),
        ({"warmup_steps": 0}, r"--warmup-steps must be a positive integer, got 0"),
        ({"lr_scale": 0.0}, r"--lr-scale must be positive"),
        ({"patience": -1}, r"--patience must be >= 0"),
        ({"ema_decay": 1.0}, r"--ema-decay must be in \(0, 1\)"),
        ({"ema_decay": 0.0}, r"--ema-decay must be in \(0, 1\)"),
        ({"init_average_last": 2}, r"--init-average-last needs --init-from"),
        ({"init_from": "r", "init_average_last": 0}, r"--init-average-last must be a positive"),
        (
            {"init_from": "r", "init_average_last": 2, "init_checkpoint": "c"},
            r"--init-checkpoint or --init-average-last, not both",
        ),
    ],
)
def test_bad_values_name_the_flag(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(TrainArgs(**changes))


def test_a_resume_refuses_changed_schedule_and_model_flags():
    saved = dataclasses.asdict(
        TrainArgs(preset="small", warmup_steps=800, lr_scale=0.8, dropout_rate=0.2, ema_decay=0.9)
    )
    check_resume(TrainArgs(), saved, "run/config.json")  # unset flags keep the saved values
    check_resume(TrainArgs(warmup_steps=800, train_steps=99), saved, "run/config.json")
    with pytest.raises(ConfigError, match=r"--lr-scale 1\.0 differs from 0\.8 in run/config\.json"):
        check_resume(TrainArgs(lr_scale=1.0), saved, "run/config.json")
    with pytest.raises(ConfigError, match=r"--preset base differs from small"):
        check_resume(TrainArgs(preset="base"), saved, "run/config.json")
    with pytest.raises(ConfigError, match=r"--ema-decay 0\.99 differs from 0\.9"):
        check_resume(TrainArgs(ema_decay=0.99), saved, "run/config.json")


@pytest.mark.parametrize(
    "argv,status",
    [(["--help"], 0), (["--preset", "huge"], 2), (["--train-steps", "-3"], 2)],
)
def test_flags_are_parsed_and_checked_before_tensorflow_loads(argv, status):
    """`train.py --help` and flag errors answer before TensorFlow is imported."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probe = (
        "import sys, train\n"
        "try:\n"
        f"    code = train.main({argv!r})\n"
        "except SystemExit as exit:\n"
        "    code = exit.code\n"
        "print('EXIT', code, 'tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert out.stdout.strip().splitlines()[-1] == f"EXIT {status} False False", out.stderr
