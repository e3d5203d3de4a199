import dataclasses
import os
import sys

import pytest

from keras_transformer.cli import train
from keras_transformer.settings.args import ConfigError, TrainArgs
from keras_transformer.settings.memory import step_floats_per_token
from keras_transformer.settings.plan import Plan
from keras_transformer.settings.recipe import resolve
from keras_transformer.settings.validation import check_resume, validate


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
    assert (out.accum_steps, out.micro_batch_memory) == (1, 4.0)  # one 4096-token batch
    assert out.train_steps == 20 * 110
    assert out.warmup_steps == 900 and isinstance(out.warmup_steps, int)  # 40%, to 100
    assert (out.lr_scale, out.dropout_rate, out.label_smoothing) == (0.8, 0.2, 0.1)
    assert out.checkpoint_every == 100 and out.eval_every == 220 and out.eval_sentences == 500


def test_subword_sampling_keeps_the_small_corpus_update_budget():
    # sampled segmentations are longer: a pass takes more batches, but the recipe's 20
    # epochs (and warmup) stay those of the deterministic segmentation, i.e. the same time
    calls = []

    def batches_per_pass(vocab_size, update_tokens, sampled=True):
        calls.append(sampled)
        return 180 if sampled else 110

    out = resolve(
        TrainArgs(subword_alpha=0.05), num_pairs=29_000, batches_per_pass=batches_per_pass
    )
    assert sorted(calls) == [False, True]
    assert (out.steps_per_epoch, out.train_steps, out.warmup_steps) == (180, 20 * 110, 900)
    # a pass set by hand, or epochs asked for, count sampled passes
    given = resolve(
        TrainArgs(subword_alpha=0.05, steps_per_epoch=150), num_pairs=29_000, batches_per_pass=never
    )
    assert given.train_steps == 20 * 150
    epochs = resolve(
        TrainArgs(subword_alpha=0.05, epochs=3), num_pairs=29_000, batches_per_pass=batches_per_pass
    )
    assert epochs.train_steps == 3 * 180


def test_large_corpus_gets_the_papers_recipe():
    for preset, steps, dropout in (("base", 100_000, 0.1), ("big", 300_000, 0.3)):
        args = TrainArgs(preset=preset, steps_per_epoch=1000)
        out = resolve(args, num_pairs=4_500_000, batches_per_pass=never)
        assert (out.vocab_size, out.batch_tokens * out.accum_steps) == (37000, 25000)
        assert (out.train_steps, out.warmup_steps, out.lr_scale) == (steps, 4000, 1.0)
        assert (out.dropout_rate, out.label_smoothing) == (dropout, 0.1)


def test_the_loss_scale_starts_at_keras_default_under_float16_only():
    def scale(**flags):
        args = TrainArgs(steps_per_epoch=10, **flags)
        return resolve(args, num_pairs=29_000, batches_per_pass=never).initial_loss_scale

    assert scale() is None and scale(precision="mixed_bfloat16") is None
    assert scale(precision="mixed_float16") == 2.0**15
    assert scale(precision="mixed_float16", initial_loss_scale=2.0**30) == 2.0**30


def test_a_large_vocabulary_update_is_accumulated_from_micro_batches():
    """37000 x 25000 float32 logits are 3.7 GB per copy: the paper's update is split into
    micro-batches that fit --micro-batch-memory on each replica, with the same tokens per
    update (and so the same steps per pass)."""
    calls = []

    def batches_per_pass(vocab_size, update_tokens):
        calls.append((vocab_size, update_tokens))
        return 4500

    out = resolve(TrainArgs(preset="base"), num_pairs=4_500_000, batches_per_pass=batches_per_pass)
    assert calls == [(37000, 25000)] and out.steps_per_epoch == 4500
    assert out.batch_tokens * out.accum_steps == 25000 and out.accum_steps > 1
    floats = step_floats_per_token("base", 37000, 128)
    assert out.batch_tokens * floats * 4 <= 4 * 2**30  # each micro-batch within 4 GiB
    assert (out.batch_tokens + 1) * 4 * floats * out.accum_steps > 4 * 2**30  # the fewest
    assert (out.accum_steps, out.batch_tokens) == (10, 2500)
    # a smaller bound, more replicas (each holds its share), longer sentences
    for changes, replicas, accum in (
        ({"micro_batch_memory": 1.0}, 1, 40),
        ({}, 8, 2),
        ({"max_length": 256}, 1, 20),
        ({"preset": "big"}, 1, 20),
    ):
        args = TrainArgs(**{"preset": "base", "steps_per_epoch": 1, **changes})
        got = resolve(args, num_pairs=4_500_000, batches_per_pass=never, replicas=replicas)
        assert (got.accum_steps, got.batch_tokens * got.accum_steps) == (accum, 25000), changes


def test_user_batch_flags_win_over_the_micro_batch_bound():
    def split(**flags):
        args = TrainArgs(preset="base", steps_per_epoch=1, **flags)
        out = resolve(args, num_pairs=4_500_000, batches_per_pass=never)
        return out.batch_tokens, out.accum_steps

    assert split(batch_tokens=25000) == (25000, 1)  # --batch-tokens alone: one micro-batch
    assert split(batch_tokens=3000, accum_steps=3) == (3000, 3)
    assert split(accum_steps=4) == (6250, 4)  # the recipe's update in 4
    assert split(accum_steps=3) == (8334, 3)


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
        ({"micro_batch_memory": 0.0}, r"--micro-batch-memory must be a positive number of GiB"),
        ({"accum_steps": 0}, r"--accum-steps must be a positive integer, got 0"),
        ({"initial_loss_scale": 1024.0}, r"--initial-loss-scale applies to --precision mixed_"),
        (
            {"initial_loss_scale": 0.5, "precision": "mixed_float16"},
            r"--initial-loss-scale must be in \[1, 2\*\*100\), got 0\.5",
        ),
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
    [
        (["--help"], 0),
        (["--preset", "huge"], 2),
        (["--train-steps", "-3"], 2),
        (["--dataset", "files"], 2),  # no --train-src/--train-tgt: a flag check too
        (["--config", "no-such-recipe.yaml"], 2),
    ],
)
def test_flags_are_parsed_and_checked_before_tensorflow_loads(argv, status):
    """`train.py --help` and flag errors answer before TensorFlow is imported."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    probe = (
        "import sys\nfrom keras_transformer.cli import train\n"
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


def test_several_training_corpora_from_the_lists():
    """files stands for every --train-src/--train-tgt pair, in the place it has in
    --dataset; weights and tags follow that order. The plan holds them, parsed once."""
    args = train.parse_args(
        ["--dataset", "multi30k,files", "--train-src", "a.en, b.en", "--train-tgt", "a.de,b.de",
         "--train-weights", "4,1,0.5", "--tag-corpus", "3,2", "--subword-alpha", "0.1"]
    )  # fmt: skip
    plan = Plan.of(args)
    assert plan.corpora.sources == (
        ("multi30k", None), ("files", ("a.en", "a.de")), ("files", ("b.en", "b.de")),
    )  # fmt: skip
    assert plan.corpora.weights == (4.0, 1.0, 0.5) and plan.corpora.tagged == (1, 2)
    assert plan.args == args and plan.args.subword_alpha == 0.1
    plain = train.parse_args(["--dataset", "files", "--train-src", "a.en", "--train-tgt", "a.de"])
    corpora = Plan.of(plain).corpora
    assert corpora.sources == (("files", ("a.en", "a.de")),)
    assert corpora.weights is None and corpora.tagged == ()


def test_the_plan_is_frozen_and_checked_once():
    """`Plan.of` checks the flags and keeps its own copy of them: changing the caller's
    TrainArgs afterwards does not change the plan, and the plan cannot be changed."""
    args = TrainArgs(train_steps=7)
    plan = Plan.of(args)
    args.train_steps = 9
    assert plan.args.train_steps == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.args = args  # type: ignore[misc]
    with pytest.raises(ConfigError, match="--train-steps must be a positive integer"):
        Plan.of(TrainArgs(train_steps=0))


def test_mix_and_sampling_flags_are_fixed_on_resume():
    saved = dataclasses.asdict(TrainArgs(train_weights="3,1", tag_corpus="2", subword_alpha=0.1))
    check_resume(TrainArgs(), saved, "config.json")  # not given: kept from config.json
    for name, value in (("train_weights", "1,1"), ("tag_corpus", "1"), ("subword_alpha", 0.2)):
        with pytest.raises(ConfigError, match=f"--{name.replace('_', '-')} {value} differs"):
            check_resume(TrainArgs(**{name: value}), saved, "config.json")
