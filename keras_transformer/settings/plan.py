"""`Plan`: what `kt-train` hands the trainer, built once from the flags (and `--config`).

The walk goes down: the command parses its flags into `TrainArgs` (`settings.args`), `Plan.of`
checks them once (`settings.validation`) and parses the corpus lists once
(`settings.corpora`); `training.trainer.train(plan)` resolves the automatic values
(`settings.recipe`) and trains. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import dataclasses

from keras_transformer.settings.args import TrainArgs, TrainSettings
from keras_transformer.settings.corpora import Corpora
from keras_transformer.settings.validation import validate


@dataclasses.dataclass(frozen=True)
class Plan:
    """The checked flags (`None`: resolved automatically) and the training corpora."""

    args: TrainArgs
    corpora: Corpora

    @classmethod
    def of(cls, args: TrainArgs) -> Plan:
        """Check `args` (ConfigError naming the flag) and parse its corpus lists."""
        args = dataclasses.replace(args)  # a copy: the plan's flags are its own
        return cls(args, validate(args))


# Below this many padded tokens per replica and micro-batch a GPU waits more than it computes:
# a step's matmuls have one row per token (a few thousand fill a V100/A100's tensor cores;
# fairseq's WMT recipes use 3584-4096 per GPU), while its fixed costs, the gradient all-reduce
# (about 260 MB for base, 850 MB for big) and the step's launches, do not shrink with it.
TOKENS_PER_REPLICA_FLOOR = 2048


def replica_tokens(settings: TrainSettings, replicas: int) -> tuple[str, str | None]:
    """(the plan's tokens-per-replica line, a warning below `TOKENS_PER_REPLICA_FLOOR` or
    None): what one replica computes per micro-batch and per update."""
    micro = settings.batch_tokens // max(1, replicas)
    update = settings.batch_tokens * settings.accum_steps
    line = (
        f"tokens per replica: {micro} per micro-batch, {micro * settings.accum_steps} per "
        f"update ({update} tokens per update = {replicas} replica{'s' * (replicas > 1)} x "
        f"{settings.accum_steps} micro-batch{'es' * (settings.accum_steps > 1)} x {micro})"
    )
    warning = None
    if micro < TOKENS_PER_REPLICA_FLOOR:
        warning = (
            f"{micro} tokens per replica and micro-batch is below {TOKENS_PER_REPLICA_FLOOR}: "
            "a GPU would mostly wait on the all-reduce; give --tokens-per-replica (and fewer "
            "--accum-steps) to keep each replica busy (docs/gpu.md)"
        )
    return line, warning


__all__ = ["TOKENS_PER_REPLICA_FLOOR", "Plan", "replica_tokens"]
