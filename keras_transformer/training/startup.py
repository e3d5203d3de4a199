"""The start-up check of a multi-worker job: every task has the same replica layout.

`MultiWorkerMirroredStrategy` needs the same devices on every task: a chief with another
device count than its workers (a common TFJob template) hangs or crashes at the first
collective. Right after the strategy is built, before any variable (the first collective),
every task publishes its layout (local devices, collective implementation) in TensorFlow's
coordination service and reads every other task's; when they differ, every task stops
with one line naming the chief's layout and the first task that differs.
"""

from __future__ import annotations

import json

import tensorflow as tf

from keras_transformer.errors import KerasTransformerError

STARTUP_TIMEOUT_S = 60  # a task's layout must be published within this (they start together)
_KEY = "kt_startup_layout"


class LayoutMismatch(KerasTransformerError, ValueError):
    """The tasks of a multi-worker job have different devices or collectives."""


def task_names(resolver) -> list[str]:
    """Every task of the job, TensorFlow's chief first ("chief:0" when there is one, else
    "worker:0"), from the strategy's cluster resolver."""
    spec = resolver.cluster_spec()
    kinds = [kind for kind in ("chief", "worker") if kind in spec.jobs]
    return [f"{kind}:{index}" for kind in kinds for index in spec.task_indices(kind)]


def local_layout(strategy: tf.distribute.Strategy) -> dict:
    """This task's replica layout: its devices and the collectives' implementation."""
    options = getattr(strategy.extended, "_communication_options", None)
    collectives = options.implementation.name if options is not None else "AUTO"
    return {"devices": len(strategy.extended.worker_devices), "collectives": collectives}


def describe(layout: dict) -> str:
    devices = layout["devices"]
    return f"{devices} device{'' if devices == 1 else 's'} ({layout['collectives']} collectives)"


def check_same_layout(strategy, layout: dict | None = None, timeout_s=STARTUP_TIMEOUT_S) -> None:
    """Raise LayoutMismatch (on every task) when a task's layout differs from the chief's.

    `layout`: this task's (default `local_layout(strategy)`; a test gives another). A task
    that publishes nothing within `timeout_s` is named in the error."""
    from tensorflow.python.eager import context as tf_context

    context = tf_context.context()
    resolver = strategy.cluster_resolver
    layout = layout or local_layout(strategy)
    context.set_config_key_value(
        f"{_KEY}/{resolver.task_type}:{resolver.task_id}", json.dumps(layout, sort_keys=True)
    )
    layouts = {}
    for task in task_names(resolver):
        try:
            value = context.get_config_key_value(f"{_KEY}/{task}", int(timeout_s * 1000))
        except tf.errors.OpError:
            raise LayoutMismatch(
                f"multi_worker start-up: task {task} did not report its devices within "
                f"{timeout_s} s (is it running, with the same TF_CONFIG cluster?)"
            ) from None
        layouts[task] = json.loads(value)
    try:  # nobody exits (the chief holds the service) before every task has read
        context.wait_at_barrier(f"{_KEY}_read", int(timeout_s * 1000))
    except tf.errors.OpError:
        pass  # a task gone already: the comparison below stands on what was read
    chief, *others = layouts
    for task in others:
        if layouts[task] != layouts[chief]:
            raise LayoutMismatch(
                f"multi_worker: the chief {chief} has {describe(layouts[chief])}, {task} has "
                f"{describe(layouts[task])}: every task of the job needs the same devices "
                "(a TFJob's chief and worker templates alike)"
            )
