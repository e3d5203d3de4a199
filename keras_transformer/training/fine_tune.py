"""Fine-tuning (`--init-from RUN_DIR`): a new run that starts from another run's model.

The new run takes from `RUN_DIR` its model configuration, its SentencePiece model (the
same bytes) and its weights: `best/` by default, `--init-checkpoint PATH`, or the mean of
its last K checkpoints (`--init-average-last K`, `Run.restore_average`, as export does;
the moving averages where a checkpoint holds them). Everything else is new: the optimizer,
the step, the schedule resolved for the new corpus, the data order and the dropout RNG.
`--dropout-rate` and `--label-smoothing` may change (they are not weights); they default
to the source's. A flag that would change the model or the tokenizer is refused.

config.json records the source as `"init": {"run": ..., "checkpoints": [...]}`. The
weights are loaded when the run has no checkpoint of its own yet; a resumed run restores
its own checkpoints and never goes back to the source.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import tensorflow as tf

from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.run_dir import Run
from keras_transformer.settings.args import (
    MODEL_FLAGS,
    ConfigError,
    TrainArgs,
    TrainSettings,
    option,
)
from keras_transformer.settings.run_config import InitRecord

logger = logging.getLogger(__name__)

PRESET_DIMS = ("num_layers", "d_model", "d_ff", "num_heads")


@dataclasses.dataclass
class Source:
    """The run a new run is fine-tuned from (`--init-from`)."""

    run: Run
    model: TransformerConfig
    settings: TrainSettings | None  # its settings (None where config.json records none)
    checkpoints: list[str]

    @classmethod
    def of(cls, args: TrainArgs) -> tuple[Source, TrainArgs]:
        """(the source run of `args.init_from`, `args` with its model flags)."""
        run = Run(args.init_from)
        if not run.exists:
            raise ConfigError(
                f"--init-from {args.init_from}: no config.json there; give the directory of a "
                "training run (its --model-dir)"
            )
        config = run.read_run_config()
        source = cls(run, config.model, config.training, [])
        inherited = source.inherit(args)  # refuses a model flag before looking for weights
        source.checkpoints = checkpoints_of(run, args)
        return source, inherited

    def values(self) -> dict:
        """The source's value of every model flag (None where it was not recorded)."""
        preset = getattr(self.settings, "preset", None) or next(
            (
                name
                for name, dims in PRESETS.items()
                if all(getattr(self.model, d) == dims[d] for d in PRESET_DIMS)
            ),
            None,
        )
        return {
            "preset": preset,
            "vocab_size": self.model.vocab_size,
            "spm_model_type": getattr(self.settings, "spm_model_type", None),
        }

    def inherit(self, args: TrainArgs) -> TrainArgs:
        """`args` with the source's model flags; refuses a given one that would change them."""
        values = self.values()
        for name in MODEL_FLAGS:
            given = getattr(args, name)
            if given is not None and given != values[name]:
                raise ConfigError(
                    f"{option(name)} {given} would change the model of --init-from "
                    f"{self.run.model_dir} ({values[name] or 'not recorded'}): a fine-tuned run "
                    f"keeps its model and SentencePiece model; drop {option(name)}"
                )
        if args.max_length > self.model.max_length:
            raise ConfigError(
                f"--max-length {args.max_length} exceeds the {self.model.max_length} positions "
                f"of the model of --init-from {self.run.model_dir}; give at most that"
            )
        inherited = {name: values[name] for name in MODEL_FLAGS}
        for name in ("dropout_rate", "label_smoothing"):
            if getattr(args, name) is None:
                inherited[name] = getattr(self.model, name)
        return dataclasses.replace(args, **inherited)

    def model_config(self, dropout_rate: float, label_smoothing: float) -> TransformerConfig:
        return self.model.replace(dropout_rate=dropout_rate, label_smoothing=label_smoothing)

    def tokenizer(self):
        return self.run.load_tokenizer()

    def record(self) -> InitRecord:
        """config.json "init": where the run started from."""
        return InitRecord(os.path.abspath(self.run.model_dir), tuple(self.checkpoints))


def checkpoints_of(run: Run, args: TrainArgs) -> list[str]:
    """The checkpoint(s) whose weights (or their mean) the new run starts from."""
    if args.init_checkpoint is not None:
        try:
            tf.train.load_checkpoint(args.init_checkpoint)
        except (ValueError, tf.errors.OpError):
            raise ConfigError(
                f"--init-checkpoint {args.init_checkpoint} is not a readable checkpoint; give "
                f"a path such as {run.path('checkpoints/ckpt-1000')} (without .index)"
            ) from None
        return [os.path.abspath(args.init_checkpoint)]
    if args.init_average_last is not None:
        paths = run.checkpoints()[-args.init_average_last :]
        where = "checkpoints/"
    else:
        paths = run.checkpoints(best=True)[-1:]
        where = "best/ (no validation BLEU yet)"
    if not paths:
        raise ConfigError(
            f"--init-from {run.model_dir} has no checkpoint in {where}: pass "
            "--init-average-last K (its last K checkpoints) or --init-checkpoint PATH"
        )
    return [os.path.abspath(p) for p in paths]


def initialize(model, init: InitRecord, keep=()) -> None:
    """Load the weights of the run's fine-tuning record (config.json "init") into `model`;
    the variables in `keep` (the dropout RNG states: the new run's own, from its --seed) keep
    their values."""
    kept = [(v, v.numpy().copy()) for v in keep]
    Run(init.run).restore_average(model, list(init.checkpoints), ema=True)
    for variable, value in kept:
        variable.assign(value)
    logger.info("initialized from %s", ", ".join(init.checkpoints))


__all__ = ["MODEL_FLAGS", "Source", "checkpoints_of", "initialize"]
