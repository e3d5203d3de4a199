"""`Run`: the one object that writes and reads a training run's `--model-dir`.

    config.json      the resolved configuration (`settings.run_config.RunConfig`):
                     {"model": ..., "training": ..., "init": ...}
    spm.model        the joint SentencePiece model; an imported OPUS-MT model
                     (`kt-import`) has source.spm, target.spm and vocab.json instead
    checkpoints/     tf.train.Checkpoint files (model, optimizer, loss scale, data position,
                     dropout RNG state, best BLEU; with --ema-decay the moving averages of
                     the trainable weights, `ema/<i>`), newest last
    best/            the weights with the best validation BLEU, and that score
    logs/            TensorBoard event files
    metrics.jsonl    one JSON object per logged event

Training (`training.trainer`), export (`serving.export_run`), the notebooks and the tests
all go through this class, so the layout is written down once. Every file operation goes
through `tf.io.gfile`, so `--model-dir` may be any file system TensorFlow knows (gs://,
s3:// with tensorflow-io, hdfs://, ram:// in tests) as well as a local path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import numpy as np
import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import write_atomic
from keras_transformer.settings.run_config import RunConfig

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "spm.model"
MARIAN_VOCAB_FILE = "vocab.json"  # data.marian_tokenizer.VOCAB_FILE
CHECKPOINT_DIR = "checkpoints"
BEST_DIR = "best"
LOG_DIR = "logs"
METRICS_FILE = "metrics.jsonl"
logger = logging.getLogger(__name__)

EMA_KEY = "ema"  # a checkpoint's moving averages: ema/<i> for the i-th trainable variable


class RunDirError(KerasTransformerError, ValueError):
    """A model directory that is missing something; the message names the path."""


class Run:
    """A training run directory (see the module docstring for its layout).

    Args:
        model_dir: the directory; created on the first write.
    """

    def __init__(self, model_dir: str):
        self.model_dir = os.fspath(model_dir)
        # the paths training writes, computed once: its modules read them as data
        self.config_file = self.path(CONFIG_FILE)
        self.checkpoint_dir = self.path(CHECKPOINT_DIR)
        self.best_dir = self.path(BEST_DIR)
        self.log_dir = self.path(LOG_DIR)

    def isfile(self, name: str) -> bool:
        path = self.path(name)
        return tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path)

    def path(self, name: str) -> str:
        return os.path.join(self.model_dir, name)

    @property
    def exists(self) -> bool:
        """True once a configuration has been written (a run to resume or export)."""
        return self.isfile(CONFIG_FILE)

    # -- configuration and tokenizer --------------------------------------------------------

    def read_run_config(self) -> RunConfig:
        """config.json as a `RunConfig`; RunDirError names the file when it is missing or bad."""
        try:
            return RunConfig.from_json(self.read_config())
        except KerasTransformerError as err:
            raise RunDirError(f"{self.path(CONFIG_FILE)}: {err}") from None

    def write_run_config(self, config: RunConfig) -> None:
        self.write_config(config.to_json())

    def create(self, config: RunConfig, tokenizer) -> None:
        """Write a new run: its tokenizer, then config.json, which marks the run as existing
        (the other workers of a job wait for it; `exists` is true from then on)."""
        self.save_tokenizer(tokenizer)
        self.write_run_config(config)

    def read_config(self) -> dict:
        """config.json's raw JSON (checked to hold a "model" object); `read_run_config` is
        what the package reads, this is for tests that edit the file."""
        path = self.path(CONFIG_FILE)
        if not self.isfile(CONFIG_FILE):
            raise RunDirError(f"{path} not found: is {self.model_dir} a training run directory?")
        try:
            with tf.io.gfile.GFile(path, "rb") as handle:
                config = json.loads(handle.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RunDirError(
                f"{path} is not valid JSON ({err}): restore it, or start a new --model-dir"
            ) from None
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            raise RunDirError(f'{path} has no "model" configuration: is it a run\'s config.json?')
        return config

    def write_config(self, config: dict) -> None:
        """Write config.json's raw JSON (`write_run_config` is what the package writes)."""
        tf.io.gfile.makedirs(self.model_dir)
        write_atomic(self.path(CONFIG_FILE), json.dumps(config, indent=2, sort_keys=True))

    def load_tokenizer(self):
        from keras_transformer.data.tokenizer import SubwordTokenizer

        if self.isfile(MARIAN_VOCAB_FILE):  # an imported OPUS-MT model (kt-import)
            from keras_transformer.data.marian_tokenizer import MarianTokenizer

            return MarianTokenizer.from_files(self._read_bytes)
        path = self.path(TOKENIZER_FILE)
        if not self.isfile(TOKENIZER_FILE):
            raise RunDirError(f"{path} not found")
        return SubwordTokenizer.load(path)

    def _read_bytes(self, name: str) -> bytes:
        if not self.isfile(name):
            raise RunDirError(f"{self.path(name)} not found")
        with tf.io.gfile.GFile(self.path(name), "rb") as handle:
            return handle.read()

    def save_tokenizer(self, tokenizer) -> None:
        """Write spm.model and make it the asset that exports of this tokenizer carry (an
        imported OPUS-MT model's tokenizer: its own files, `MarianTokenizer.files()`)."""
        tf.io.gfile.makedirs(self.model_dir)
        if hasattr(tokenizer, "files"):
            for name, data in tokenizer.files().items():
                write_atomic(self.path(name), data)
            return
        write_atomic(self.path(TOKENIZER_FILE), tokenizer.proto)
        tokenizer.model_asset = tf.saved_model.Asset(self.path(TOKENIZER_FILE))

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint_manager(self, checkpoint, *, best: bool = False, max_to_keep: int = 5):
        """A tf.train.CheckpointManager on checkpoints/ (or best/, which keeps one)."""
        directory = self.path(BEST_DIR if best else CHECKPOINT_DIR)
        return tf.train.CheckpointManager(
            checkpoint, directory, max_to_keep=1 if best else max_to_keep
        )

    def checkpoints(self, *, best: bool = False) -> list[str]:
        """Complete checkpoints, oldest first.

        CheckpointManager updates its state file only after a save has written every file,
        so a save killed half-way is never listed; a listed checkpoint whose index file is
        gone (deleted by hand) is skipped too.
        """
        state = tf.train.get_checkpoint_state(self.path(BEST_DIR if best else CHECKPOINT_DIR))
        if state is None:
            return []
        return [p for p in state.all_model_checkpoint_paths if tf.io.gfile.exists(p + ".index")]

    def restore_average(self, model, paths: list[str], *, ema: bool = True) -> None:
        """Load the mean of the model weights stored in `paths` (paper: the last 5).

        With `ema`, a checkpoint that holds moving averages of the weights (--ema-decay)
        contributes those instead of its raw trainable weights. Every checkpoint must hold
        every weight of `model` with the same shape; one that does not (another
        configuration, a truncated file) raises RunDirError naming it, instead of silently
        averaging freshly initialized weights.
        """
        if not paths:
            raise RunDirError(f"no checkpoint to restore in {self.model_dir}")
        original, total = model.get_weights(), None
        for path in paths:
            try:
                status = tf.train.Checkpoint(model=model).restore(path)
                status.assert_existing_objects_matched().expect_partial()  # optimizer: unused
                if ema and has_averages(path):
                    averaged = tf.train.Checkpoint(**{EMA_KEY: list(model.trainable_variables)})
                    averaged.restore(path).assert_existing_objects_matched().expect_partial()
            except (AssertionError, ValueError, tf.errors.OpError) as err:
                model.set_weights(original)  # a failed average leaves the model as it was
                first = str(err).strip().splitlines()[0][:300]
                raise RunDirError(f"checkpoint {path} does not match the model: {first}") from None
            weights = model.get_weights()
            total = weights if total is None else [a + b for a, b in zip(total, weights)]
        model.set_weights([np.asarray(w / len(paths), dtype=w.dtype) for w in total])

    def load_model(self, *, average_last: int = 1, best: bool = False, ema: bool = True):
        """(model, tokenizer) with restored weights: the best checkpoint, or the mean of the
        last `average_last` checkpoints (their moving averages when they hold them and `ema`;
        best/ holds the weights that were validated, averaged or not)."""
        from keras_transformer.model import Transformer

        if not isinstance(average_last, int) or average_last < 1:
            raise RunDirError(f"average_last must be a positive integer, got {average_last!r}")
        config = self.read_run_config().model
        tokenizer = self.load_tokenizer()
        model = Transformer(config)
        model.build()
        paths = self.checkpoints(best=best)
        if not paths:
            raise RunDirError(f"no checkpoint in {self.path(BEST_DIR if best else CHECKPOINT_DIR)}")
        self.restore_average(model, paths[-average_last:], ema=ema)
        return model, tokenizer

    # -- metrics ----------------------------------------------------------------------------

    def append_metrics(self, record: dict) -> None:
        with tf.io.gfile.GFile(self.path(METRICS_FILE), "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def truncate_metrics(self, step: int) -> list[dict]:
        """Keep the events up to `step` (a resumed run writes the later ones again); returns
        the events kept."""
        kept = [r for r in self.read_metrics() if r.get("step", 0) <= step]
        if self.isfile(METRICS_FILE):
            write_atomic(self.path(METRICS_FILE), "".join(json.dumps(r) + "\n" for r in kept))
        return kept

    def read_metrics(self) -> list[dict]:
        """The events of metrics.jsonl, in order. A last line cut short (a kill during its
        write: no newline, not JSON) is skipped with a warning, and goes at the next
        truncation; a bad line anywhere else raises RunDirError naming the file and line."""
        if not self.isfile(METRICS_FILE):
            return []
        path = self.path(METRICS_FILE)
        with tf.io.gfile.GFile(path, "rb") as handle:
            lines = handle.read().split(b"\n")  # the last: b"" after a complete line
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError as err:  # JSONDecodeError and UnicodeDecodeError included
                if number == len(lines):  # no newline after it: a write cut short
                    logger.warning(
                        "%s line %d is incomplete (a killed write): skipped", path, number
                    )
                    continue
                raise RunDirError(
                    f"{path} line {number} is not a JSON object ({err}): repair or delete that line"
                ) from None
            records.append(record)
        return records


@dataclasses.dataclass(frozen=True)
class RunState:
    """A run directory as a training job found it at its start, read once (`RunState.read`):
    its `Run`, whether it holds a run to resume (config.json) and its complete checkpoints,
    oldest first. Training reads these as data: only the chief writes the directory, its
    config.json before any worker reads a run's configuration, its checkpoints once every
    worker has restored (the collective step check)."""

    run: Run
    exists: bool
    checkpoints: tuple[str, ...]

    @classmethod
    def read(cls, model_dir: str) -> RunState:
        run = Run(model_dir)
        return cls(run, run.exists, tuple(run.checkpoints()))


def has_averages(checkpoint_path: str) -> bool:
    """True when the checkpoint holds moving averages of the weights (--ema-decay)."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    return reader.has_tensor(f"{EMA_KEY}/0/.ATTRIBUTES/VARIABLE_VALUE")


def load_trained(model_dir: str, *, average_last: int = 1, use_best: bool = False, ema=True):
    """(model, tokenizer, RunConfig) from a run directory, with restored weights (the moving
    averages where the checkpoints hold them, unless `ema` is False)."""
    run = Run(model_dir)
    model, tokenizer = run.load_model(average_last=average_last, best=use_best, ema=ema)
    return model, tokenizer, run.read_run_config()


__all__ = ["EMA_KEY", "Run", "RunDirError", "RunState", "has_averages", "load_trained"]
