"""What the replicas agree on: in a training step, the sums of its scalars (`step_sums`, one
all-reduce); between steps, a flag (any worker's), every replica's restored step, counts
summed over the workers (the validation BLEU's statistics)."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute import multi_worker_util

from keras_transformer.training.callback_state import TrainingError


def all_reduce_sum(value):
    """Sum over replicas inside a distribution strategy; identity outside one."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def step_sums(tokens, positions=None):
    """(the global token count, every replica's largest stream position in replica order
    (replicas,) int64, or None without `positions`) from this replica's `tokens` (a float
    count) and the (B,) stream positions of its rows (-1 for none).

    One all-reduce of a float64 vector: the count, then each replica's position in a slot
    of its own (zero elsewhere), which sums to the all-gather it replaces. Integers below
    2**53 stay exact in float64, and the count comes back in `tokens`' dtype exactly below
    2**24 tokens per step."""
    local = None
    if positions is not None:
        local = tf.reduce_max(tf.concat([tf.cast(positions, tf.int64), [-1]], axis=0))
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return tokens, None if local is None else local[tf.newaxis]
    packed = tf.cast(tokens, tf.float64)[tf.newaxis]
    if local is not None:
        slot = tf.one_hot(
            context.replica_id_in_sync_group, context.num_replicas_in_sync, dtype=tf.float64
        )
        packed = tf.concat([packed, slot * tf.cast(local, tf.float64)], axis=0)
    total = all_reduce_sum(packed)
    return tf.cast(total[0], tokens.dtype), None if local is None else tf.cast(total[1:], tf.int64)


def agree_any(strategy: tf.distribute.Strategy | None, flag: bool) -> bool:
    """True on every worker if it is True on any: a collective in multi-worker runs (every
    worker must call it at the same point); the flag itself elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return flag
    return float(_replica_sum(strategy, lambda _: tf.constant(1.0 if flag else 0.0))) > 0.0


def replica_steps(strategy: tf.distribute.Strategy, step: int) -> list[int]:
    """Every replica's `step`, in replica order: a collective in multi-worker runs (each
    replica contributes its step at its own index of a vector summed over replicas, the
    reduction `agree_any` uses); [step] elsewhere."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return [step]
    count = strategy.num_replicas_in_sync
    total = _replica_sum(
        strategy,
        lambda context: (
            tf.one_hot(context.replica_id_in_sync_group, count, dtype=tf.float64) * float(step)
        ),
    )
    return [int(s) for s in total]


def worker_share(strategy: tf.distribute.Strategy | None) -> tuple[int, int]:
    """(index, count) of this worker among the job's: TensorFlow's own numbering
    (`multi_worker_util.id_in_cluster`: a "chief" task first, then the workers), the one the
    strategy numbers its replicas by; (0, 1) outside multi-worker runs."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 0, 1
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec()
    index = multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id)
    return index, multi_worker_util.worker_count(spec, resolver.task_type)


def sum_over_workers(strategy: tf.distribute.Strategy | None, counts: list[int]) -> list[int]:
    """Each worker's `counts` (integers, the same length everywhere) summed over the workers:
    one collective in multi-worker runs (every worker must call it at the same point), the
    counts themselves elsewhere. Each worker adds its counts once, on its first replica (the
    others add zeros); float64 keeps sums below 2**53 exact."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return list(counts)
    first = worker_share(strategy)[0] * len(strategy.extended.worker_devices)
    zeros = [0] * len(counts)
    total = _replica_sum(
        strategy,
        lambda context: tf.constant(
            counts if context.replica_id_in_sync_group == first else zeros, tf.float64
        ),
    )
    return [int(round(float(v))) for v in total.numpy()]


def _replica_sum(strategy: tf.distribute.Strategy, value_fn):
    """`value_fn(context)` (a tensor per replica, from its `ValueContext`) summed over the
    replicas, outside a step: one collective under MultiWorkerMirroredStrategy."""
    value = strategy.experimental_distribute_values_from_function(value_fn)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)


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
