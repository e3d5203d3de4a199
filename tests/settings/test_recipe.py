"""The automatic recipe (`settings.recipe.resolve`): the default plan stays as it was measured,
and a run shorter than the recipe's intervals gets intervals inside it."""

from __future__ import annotations

import os

import pytest

from keras_transformer.cli import train
from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.recipe import resolve

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MULTI30K_PASS = 151  # batches of one pass over Multi30k en-de at the default recipe (0.2.0)


def multi30k(*_args, **_kwargs):
    return MULTI30K_PASS


def never(*_):
    raise AssertionError("batches_per_pass must not be called when --steps-per-epoch is set")


@pytest.fixture(autouse=True)
def _no_data_dir(monkeypatch):
    monkeypatch.delenv("KT_DATA_DIR", raising=False)


def schedule(out):
    return (
        out.steps_per_epoch,
        out.train_steps,
        out.warmup_steps,
        out.checkpoint_every,
        out.eval_every,
    )


def test_the_default_multi30k_recipe_resolves_as_before():
    """What `kt-train` prints on Multi30k (and what trained the measured runs): 151 batches a
    pass x 20 = 3,020 updates, warmup 1,200, a checkpoint every 100, BLEU every 302."""
    out = resolve(TrainArgs(), num_pairs=29_000, batches_per_pass=multi30k)
    assert schedule(out) == (151, 3020, 1200, 100, 302)
    assert (out.vocab_size, out.batch_tokens, out.accum_steps) == (8000, 4096, 1)
    assert (out.lr_scale, out.dropout_rate) == (0.8, 0.2)


@pytest.mark.parametrize(
    "steps_per_pass, expected",
    [
        (110, (110, 2200, 900, 100, 220)),  # shorter passes (tests/settings/test_args.py)
        (25, (25, 500, 200, 100, 50)),  # 500 updates: the shortest run no cap touches
    ],
)
def test_runs_of_500_updates_and_more_are_not_changed(steps_per_pass, expected):
    out = resolve(TrainArgs(), num_pairs=29_000, batches_per_pass=lambda *a, **k: steps_per_pass)
    assert schedule(out) == expected


def test_the_large_corpus_recipe_is_not_changed():
    out = resolve(TrainArgs(preset="base", steps_per_epoch=4500), num_pairs=4_500_000,
                  batches_per_pass=never)  # fmt: skip
    assert schedule(out) == (4500, 100_000, 4000, 1400, 10_000)


def inside(out) -> bool:
    steps = out.train_steps
    return (
        1 <= out.warmup_steps <= max(1, steps // 2)
        and 1 <= out.checkpoint_every <= steps
        and 1 <= out.eval_every <= steps
        and 1 <= out.steps_per_epoch <= steps
    )


@pytest.mark.parametrize("steps", [1, 2, 60, 99, 150, 499])
def test_a_short_run_on_a_small_corpus_has_every_interval_inside_it(steps):
    """A 60-step run on Multi30k resolved warmup 100, a checkpoint every 100, BLEU every 151
    and 151-batch epochs (the progress bar's 151/151): all longer than the run."""
    out = resolve(TrainArgs(train_steps=steps), num_pairs=29_000, batches_per_pass=multi30k)
    assert inside(out), schedule(out)
    assert out.train_steps == steps


def test_a_short_run_on_a_large_corpus_has_every_interval_inside_it():
    out = resolve(TrainArgs(preset="base", train_steps=60), num_pairs=4_500_000,
                  batches_per_pass=lambda *a, **k: 4500)  # fmt: skip
    assert schedule(out) == (60, 60, 30, 60, 60)


def test_what_the_user_sets_is_kept():
    args = TrainArgs(train_steps=60, warmup_steps=500, checkpoint_every=200, steps_per_epoch=300)
    out = resolve(args, num_pairs=29_000, batches_per_pass=never)
    assert schedule(out) == (300, 60, 500, 200, 60)


def test_the_smoke_recipe_resolves_with_every_interval_inside_the_run():
    args = train.parse_args(["--config", os.path.join(ROOT, "recipes", "smoke.yaml")])
    out = resolve(args, num_pairs=29_000, batches_per_pass=multi30k)
    assert inside(out), schedule(out)
    assert out.train_steps < 20 * MULTI30K_PASS  # a smoke run, not the default recipe
