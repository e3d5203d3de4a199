"""The automatic recipe (`settings.recipe.resolve`): the default plan stays as it was measured,
a run shorter than the recipe's intervals gets intervals inside it, --tokens-per-replica is a
per-replica budget (fairseq's --max-tokens), and the plan's tokens-per-replica line."""

from __future__ import annotations

import dataclasses
import os

import pytest

from keras_transformer.cli import train
from keras_transformer.config import ConfigError
from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.plan import TOKENS_PER_REPLICA_FLOOR, replica_tokens
from keras_transformer.settings.recipe import resolve
from keras_transformer.settings.validation import validate

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
        1 <= out.checkpoint_every <= steps
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
    assert schedule(out) == (60, 60, 4000, 60, 60)  # warmup: not capped (resume)


def test_what_the_user_sets_is_kept():
    args = TrainArgs(train_steps=60, warmup_steps=500, checkpoint_every=200, steps_per_epoch=300)
    out = resolve(args, num_pairs=29_000, batches_per_pass=never)
    assert schedule(out) == (300, 60, 500, 200, 60)


def test_the_smoke_recipe_resolves_with_every_interval_inside_the_run():
    args = train.parse_args(["--config", os.path.join(ROOT, "recipes", "smoke.yaml")])
    out = resolve(args, num_pairs=29_000, batches_per_pass=multi30k)
    assert inside(out), schedule(out)
    assert out.train_steps < 20 * MULTI30K_PASS  # a smoke run, not the default recipe


# -- the batch: --tokens-per-replica and the plan's line ---------------------------------------


def planned(replicas=1, **flags):
    return resolve(
        TrainArgs(**flags), num_pairs=29000, batches_per_pass=lambda *_, **__: 250,
        replicas=replicas,
    )  # fmt: skip


def test_the_default_recipe_resolves_as_before():
    out = dataclasses.asdict(planned())
    expected = dict(
        preset="small", vocab_size=8000, batch_tokens=4096, accum_steps=1, cpu_devices=1,
        steps_per_epoch=250, train_steps=5000, warmup_steps=2000, checkpoint_every=100,
        eval_every=500, lr_scale=0.8, dropout_rate=0.2, precision="float32",
        micro_batch_memory=4.0, tokens_per_replica=None,
    )  # fmt: skip
    assert {k: out[k] for k in expected} == expected


def test_tokens_per_replica_sets_the_global_batch():
    out = planned(replicas=8, tokens_per_replica=3584)
    assert (out.batch_tokens, out.accum_steps) == (8 * 3584, 1)
    out = planned(replicas=8, tokens_per_replica=3584, accum_steps=4)
    assert (out.batch_tokens, out.accum_steps) == (8 * 3584, 4)
    assert planned(replicas=8, tokens_per_replica=3584).warmup_steps == 2000  # not rescaled
    with pytest.raises(ConfigError, match="--tokens-per-replica or --batch-tokens"):
        validate(TrainArgs(tokens_per_replica=2048, batch_tokens=4096))
    with pytest.raises(ConfigError, match="--tokens-per-replica must be a positive integer"):
        validate(TrainArgs(tokens_per_replica=0))


def test_the_tokens_per_replica_line_and_its_floor():
    line, warning = replica_tokens(planned(), 1)
    assert line == (
        "tokens per replica: 4096 per micro-batch, 4096 per update "
        "(4096 tokens per update = 1 replica x 1 micro-batch x 4096)"
    )
    assert warning is None
    wmt = resolve(
        TrainArgs(preset="base", steps_per_epoch=1000), num_pairs=4_500_000,
        batches_per_pass=None, replicas=8,
    )  # fmt: skip
    line, warning = replica_tokens(wmt, 8)  # the paper's 25000 tokens shared by 8 GPUs
    assert line.startswith("tokens per replica: 1562 per micro-batch, 3124 per update")
    assert f"below {TOKENS_PER_REPLICA_FLOOR}" in warning and "--tokens-per-replica" in warning
    fed = resolve(
        TrainArgs(preset="base", steps_per_epoch=1000, tokens_per_replica=3125),
        num_pairs=4_500_000, batches_per_pass=None, replicas=8,
    )  # fmt: skip
    assert fed.batch_tokens * fed.accum_steps == 25000
    assert replica_tokens(fed, 8)[1] is None
