"""The layout of a training run's `--model-dir`, shared by training, export and evaluation.

config.json      the resolved configuration: {"model": ..., "training": ..., "data": ...}
spm.model        the SentencePiece model
checkpoints/     tf.train.Checkpoint files (model, optimizer, loss scale), newest last
best/            the checkpoint with the best validation BLEU
logs/            TensorBoard event files
metrics.jsonl    one JSON object per logged event
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from keras_transformer.config import TransformerConfig
from keras_transformer.errors import KerasTransformerError

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
LOG_DIR = "logs"
METRICS_FILE = "metrics.jsonl"


class RunDirError(KerasTransformerError, ValueError):
    """A model directory that is missing something; the message names the path."""


def read_config(model_dir: str) -> dict:
    path = os.path.join(model_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise RunDirError(f"{path} not found: is {model_dir} a training run's --model-dir?")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json_atomic(path: str, value) -> None:
    """Write then rename, so a crash never leaves a half-written file."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True)
    os.replace(tmp, path)


def checkpoint_paths(model_dir: str, subdir: str = CHECKPOINT_DIR) -> list[str]:
    """Complete checkpoints, oldest first (the state file is only written after a save ends)."""
    state = tf.train.get_checkpoint_state(os.path.join(model_dir, subdir))
    if state is None:
        return []
    return [p for p in state.all_model_checkpoint_paths if tf.io.gfile.exists(p + ".index")]


def restore_average(model, paths: list[str]) -> None:
    """Load the mean of the model weights stored in `paths` (paper: last 5 for base)."""
    if not paths:
        raise RunDirError("no checkpoint to restore")
    total = None
    for path in paths:
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
        weights = model.get_weights()
        total = weights if total is None else [a + b for a, b in zip(total, weights)]
    model.set_weights([np.asarray(w / len(paths), dtype=w.dtype) for w in total])


def load_trained(model_dir: str, *, average_last: int = 1, use_best: bool = False):
    """(model, tokenizer, run config) from a run directory, with restored weights."""
    from keras_transformer.data.tokenizer import SubwordTokenizer
    from keras_transformer.model import Transformer

    run = read_config(model_dir)
    spm_path = os.path.join(model_dir, TOKENIZER_FILE)
    if not os.path.isfile(spm_path):
        raise RunDirError(f"{spm_path} not found")
    tokenizer = SubwordTokenizer.load(spm_path)
    model = Transformer(TransformerConfig.from_dict(run["model"]))
    model.build()
    paths = checkpoint_paths(model_dir, BEST_DIR if use_best else CHECKPOINT_DIR)
    if not paths:
        where = os.path.join(model_dir, BEST_DIR if use_best else CHECKPOINT_DIR)
        raise RunDirError(f"no checkpoint in {where}")
    if average_last < 1:
        raise RunDirError(f"--average-last must be >= 1, got {average_last}")
    restore_average(model, paths[-average_last:])
    return model, tokenizer, run
