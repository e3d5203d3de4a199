"""A small trained run directory, written through `Run` as train.py writes it, for export
and serving tests."""

from __future__ import annotations

import gzip
import os

import keras
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.data import (
    SubwordTokenizer,
    load_parallel,
    make_batches,
    train_sentencepiece,
)
from keras_transformer.run_dir import Run
from keras_transformer.training.step import TrainingModel


def make_run(
    model_dir: str,
    multi30k_dir: str,
    steps: int = 30,
    vocab_size: int = 600,
    named=False,
    num_layers: int = 2,
    seed: int | None = None,
) -> str:
    """`named`: config.json's training settings name the dataset, as train.py writes them
    (the export's agreement report reads the validation set from them). `num_layers`: 1 where
    XLA compiles the search (its compile time grows with the layers). `seed`: every random
    seed set first (`keras.utils.set_random_seed`), so the weights do not depend on which
    tests this worker ran before; it clears TensorFlow's kernel cache, so only where no
    tokenizer built earlier is still in use. Without it the weights follow the process's
    random state."""
    if seed is not None:
        keras.utils.set_random_seed(seed)
    run = Run(model_dir)
    sentences = []
    for name in ("train.en.gz", "train.de.gz"):
        with gzip.open(os.path.join(multi30k_dir, name), "rt", encoding="utf-8") as handle:
            sentences += [line.strip() for _, line in zip(range(3000), handle)]
    tokenizer = SubwordTokenizer(train_sentencepiece(sentences, vocab_size))
    run.save_tokenizer(tokenizer)
    cfg = kt.TransformerConfig.preset(
        "tiny", num_layers=num_layers, vocab_size=tokenizer.vocab_size, max_length=64
    )
    dataset = dict(dataset="multi30k", src_lang="en", tgt_lang="de", data_dir=multi30k_dir)
    training = dataset if named else {}
    run.write_config({"model": cfg.to_dict(), "training": training})
    model = TrainingModel(kt.Transformer(cfg))
    model.compile(
        optimizer=kt.paper_optimizer(cfg.d_model, 50, scale=2.0),
        loss=kt.LabelSmoothedCrossEntropy(),
    )
    pairs = load_parallel("multi30k", "validation", "en", "de", data_dir=multi30k_dir)
    data = make_batches(pairs.dataset, tokenizer, batch_tokens=1024, max_length=64).repeat()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
    manager = run.checkpoint_manager(
        tf.train.Checkpoint(model=model.transformer, optimizer=model.optimizer)
    )
    manager.save(checkpoint_number=steps)
    keras.backend.clear_session(free_memory=False)
    return model_dir
