"""What the workers of a multi-worker run agree on: a flag (any worker's), every replica's
restored step."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.training.callback_state import TrainingError


def agree_any(strategy: tf.distribute.Strategy | None, flag: bool) -> bool:
    """True on every worker if it is True on any: a collective in multi-worker runs (every
    worker must call it at the same point); the flag itself elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return flag
    value = strategy.experimental_distribute_values_from_function(
        lambda _: tf.constant(1.0 if flag else 0.0)
    )
    return float(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)) > 0.0


def replica_steps(strategy: tf.distribute.Strategy, step: int) -> list[int]:
    """Every replica's `step`, in replica order: a collective in multi-worker runs (each
    replica contributes its step at its own index of a vector summed over replicas, the
    reduction `agree_any` uses); [step] elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return [step]
    count = strategy.num_replicas_in_sync
    value = strategy.experimental_distribute_values_from_function(
        lambda context: (
            tf.one_hot(context.replica_id_in_sync_group, count, dtype=tf.float64) * float(step)
        )
    )
    return [int(s) for s in strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)]


def check_same_step(steps: list[int], tasks: list[str]) -> None:
    """Raise TrainingError naming the tasks whose restored step differs from the chief's
    (`steps[i]` restored by `tasks[i]`, the chief first), e.g. a worker that could not see
    the run directory and started from step 0."""
    if len(set(steps)) <= 1:
        return
    differ = [f"{task} at step {s}" for task, s in zip(tasks, steps) if s != steps[0]]
    raise TrainingError(
        f"the workers restored different steps: {tasks[0]} at step {steps[0]}, "
        f"{', '.join(differ)}; every task must see the same --model-dir (a shared directory)"
    )
