"""The automatic recipe's batch: the default resolves as before, --tokens-per-replica is a
per-replica budget (fairseq's --max-tokens), and the plan's tokens-per-replica line."""

import dataclasses

import pytest

from keras_transformer.config import ConfigError
from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.recipe import TOKENS_PER_REPLICA_FLOOR, replica_tokens, resolve
from keras_transformer.settings.validation import validate


def multi30k(replicas=1, **flags):
    return resolve(
        TrainArgs(**flags), num_pairs=29000, batches_per_pass=lambda *_, **__: 250,
        replicas=replicas,
    )  # fmt: skip


def test_the_default_recipe_resolves_as_before():
    out = dataclasses.asdict(multi30k())
    expected = dict(
        preset="small", vocab_size=8000, batch_tokens=4096, accum_steps=1, cpu_devices=1,
        steps_per_epoch=250, train_steps=5000, warmup_steps=2000, checkpoint_every=100,
        eval_every=500, lr_scale=0.8, dropout_rate=0.2, precision="float32",
        micro_batch_memory=4.0, tokens_per_replica=None,
    )  # fmt: skip
    assert {k: out[k] for k in expected} == expected


def test_tokens_per_replica_sets_the_global_batch():
    out = multi30k(replicas=8, tokens_per_replica=3584)
    assert (out.batch_tokens, out.accum_steps) == (8 * 3584, 1)
    out = multi30k(replicas=8, tokens_per_replica=3584, accum_steps=4)
    assert (out.batch_tokens, out.accum_steps) == (8 * 3584, 4)
    assert multi30k(replicas=8, tokens_per_replica=3584).warmup_steps == 2000  # not rescaled
    with pytest.raises(ConfigError, match="--tokens-per-replica or --batch-tokens"):
        validate(TrainArgs(tokens_per_replica=2048, batch_tokens=4096))
    with pytest.raises(ConfigError, match="--tokens-per-replica must be a positive integer"):
        validate(TrainArgs(tokens_per_replica=0))


def test_the_tokens_per_replica_line_and_its_floor():
    line, warning = replica_tokens(multi30k(), 1)
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
