"""--init-from: fine-tuning a run on other data (training.fine_tune)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.data import load_parallel, training_batches
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.run_dir import Run
from tests.training.small_corpus import run_commands, train_argv, write_corpus

SOURCE = ("--train-steps", "8", "--steps-per-epoch", "8", "--eval-every", "8",
          "--dropout-rate", "0", "--lr-scale", "4")  # fmt: skip
TUNE = ("--steps-per-epoch", "2", "--checkpoint-every", "2", "--eval-every", "4",
        "--log-every", "1", "--dropout-rate", "0")  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory, multi30k_dir):
    """The source run (8 steps on train lines 0-600, best/ at step 8) and three fine-tuned
    runs on train lines 600-1200: 4 steps left alone, and 2 steps then resumed to 4. The
    four commands run in order in one process tree (one import of TensorFlow)."""
    base = tmp_path_factory.mktemp("fine_tune")
    source = base / "source"
    data = write_corpus(base / "a", multi30k_dir, 0, 600)
    other = write_corpus(base / "b", multi30k_dir, 600, 1200)
    alone, resumed = base / "alone", base / "resumed"
    tune = (*other, *TUNE, "--init-from", str(source), "--train-steps")
    _, first, _, again = run_commands(
        train_argv(source, *data, *SOURCE),
        train_argv(alone, *tune, "4"),
        train_argv(resumed, *tune, "2"),
        train_argv(resumed, *tune, "4"),
    )
    return dict(source=source, alone=alone, resumed=resumed, data=base / "b", logs=(first, again))


def first_batch(data_dir, tokenizer):
    """The first batch the fine-tuned run trains on (its --seed 0 stream)."""
    train = load_parallel(
        "files",
        "train",
        "en",
        "de",
        files=(str(data_dir / "train.en"), str(data_dir / "train.de")),
    )
    batches = training_batches(
        train, tokenizer, batch_tokens=512, max_length=32, seed=0, positions=True
    )
    return next(iter(batches))


def loss_on(model, batch) -> float:
    (src, tgt_in), tgt_out = batch[:2]
    logits = model((src, tgt_in), training=False)
    total, count = LabelSmoothedCrossEntropy(0.1).sum_and_count(tgt_out, logits)
    return float(total / count)


@pytest.mark.slow
def test_fine_tuning_starts_from_the_source_weights_and_tokenizer(runs):
    source, alone = Run(str(runs["source"])), Run(str(runs["alone"]))
    with open(source.path("spm.model"), "rb") as a, open(alone.path("spm.model"), "rb") as b:
        assert a.read() == b.read()  # the tokenizer, byte for byte
    config, source_config = alone.read_config(), source.read_config()
    assert config["model"] == source_config["model"]
    best = source.checkpoints(best=True)[-1]
    assert best.endswith("ckpt-8")
    assert config["init"] == {"run": str(runs["source"]), "checkpoints": [os.path.abspath(best)]}
    assert config["training"]["init_from"] == str(runs["source"])
    assert config["training"]["preset"] == "tiny" and config["training"]["vocab_size"] == 400
    assert "initialized from" in runs["logs"][0].stdout

    # the first update's loss is the source model's loss on that batch, not a fresh model's
    logged = next(r["loss"] for r in alone.read_metrics() if r["step"] == 1)
    model, tokenizer = source.load_model(best=True)
    batch = first_batch(runs["data"], tokenizer)
    expected = loss_on(model, batch)
    np.testing.assert_allclose(logged, expected, rtol=1e-5)
    fresh = kt.Transformer(source.read_run_config().model)  # what training from scratch starts with
    assert abs(logged - loss_on(fresh, batch)) > 0.1
    # a fine-tuned run has a fresh optimizer: step, schedule and Adam moments start again
    reader = tf.train.load_checkpoint(alone.checkpoints()[-1])
    assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 4


def checkpoint_tensors(path) -> dict:
    reader = tf.train.load_checkpoint(path)
    names = [n for n in reader.get_variable_to_shape_map() if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {name: reader.get_tensor(name) for name in names}


@pytest.mark.slow
def test_resuming_a_fine_tuned_run_is_exact_and_does_not_reinitialize(runs):
    again = runs["logs"][1].stdout
    assert "resumed from" in again and "at step 2" in again and "initialized from" not in again
    alone = checkpoint_tensors(Run(str(runs["alone"])).checkpoints()[-1])
    resumed = checkpoint_tensors(Run(str(runs["resumed"])).checkpoints()[-1])
    assert set(alone) == set(resumed)
    for name, value in alone.items():
        np.testing.assert_allclose(resumed[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
