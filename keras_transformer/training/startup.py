"""The start-up check of a multi-worker job: every task has the same replica layout.

`MultiWorkerMirroredStrategy` needs the same devices on every task: a chief with another
device count than its workers (a common TFJob template) hangs or crashes at the first
collective. Right after the strategy is built, before any variable (the first collective),
every task publishes its layout (local devices, collective implementation) in TensorFlow's
coordination service and reads every other task's; when they differ, every task stops
with one line naming the chief's layout and the first task that differs. The run directory
too: the chief writes a token in `--model-dir`, every other task reads it there; a task that
cannot (a node-local directory, another volume) is named, instead of waiting hours for a
config.json it will never see (--worker-wait).
"""

from __future__ import annotations

import json
import uuid

import tensorflow as tf

from keras_transformer.errors import KerasTransformerError
from keras_transformer.files import write_atomic
from keras_transformer.run_dir import Run

STARTUP_TIMEOUT_S = 60  # a task's layout must be published within this (they start together)
_KEY = "kt_startup_layout"
PROBE_FILE = ".kt-startup"  # the chief writes a token here; every task must read it


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


def check_same_layout(
    strategy, layout: dict | None = None, timeout_s=STARTUP_TIMEOUT_S, model_dir=None
) -> None:
    """Raise LayoutMismatch (on every task) when a task's layout differs from the chief's,
    or when a task cannot see the run directory the chief writes (`model_dir`: the chief
    writes a token in its start-up file there; a task that does not read it is named).

    `layout`: this task's (default `local_layout(strategy)`; a test gives another). A task
    that publishes nothing within `timeout_s` is named in the error."""
    from tensorflow.python.eager import context as tf_context

    context = tf_context.context()
    resolver = strategy.cluster_resolver
    tasks, me = task_names(resolver), f"{resolver.task_type}:{resolver.task_id}"
    layout = dict(layout or local_layout(strategy))
    if me == tasks[0]:  # the chief: its start-up file first, then its layout
        layout["run_dir"] = write_probe(model_dir)
    else:
        layout["run_dir"] = read_probe(model_dir, read_layout(context, tasks[0], timeout_s))
    context.set_config_key_value(f"{_KEY}/{me}", json.dumps(layout, sort_keys=True))
    layouts = {task: read_layout(context, task, timeout_s) for task in tasks}
    try:  # nobody exits (the chief holds the service) before every task has read
        context.wait_at_barrier(f"{_KEY}_read", int(timeout_s * 1000))
    except tf.errors.OpError:
        pass  # a task gone already: the comparison below stands on what was read
    if me == tasks[0] and model_dir is not None:
        tf.io.gfile.remove(Run(model_dir).path(PROBE_FILE))
    compare(layouts, model_dir)


def read_layout(context, task: str, timeout_s) -> dict:
    """The layout `task` published, waiting up to `timeout_s`."""
    try:
        value = context.get_config_key_value(f"{_KEY}/{task}", int(timeout_s * 1000))
    except tf.errors.OpError:
        raise LayoutMismatch(
            f"multi_worker start-up: task {task} did not report its devices within "
            f"{timeout_s} s (is it running, with the same TF_CONFIG cluster?)"
        ) from None
    return json.loads(value)


def write_probe(model_dir) -> str | None:
    """The chief: a new token in `model_dir`'s start-up file (None without a directory)."""
    if model_dir is None:
        return None
    token = uuid.uuid4().hex
    tf.io.gfile.makedirs(model_dir)
    write_atomic(Run(model_dir).path(PROBE_FILE), token)  # never read half-written
    return token


def read_probe(model_dir, chief: dict) -> str | None:
    """A worker: the token it reads in its `model_dir`'s start-up file (None: no file)."""
    if model_dir is None or chief.get("run_dir") is None:
        return chief.get("run_dir")
    try:
        with tf.io.gfile.GFile(Run(model_dir).path(PROBE_FILE)) as handle:
            return handle.read()
    except tf.errors.OpError:  # not found, not readable: not the chief's directory
        return None


def compare(layouts: dict, model_dir) -> None:
    """LayoutMismatch naming the first task that differs from the chief (the first task)."""
    chief, *others = layouts
    devices = {task: {k: v for k, v in layouts[task].items() if k != "run_dir"} for task in layouts}
    for task in others:
        if devices[task] != devices[chief]:
            raise LayoutMismatch(
                f"multi_worker: the chief {chief} has {describe(layouts[chief])}, {task} has "
                f"{describe(layouts[task])}: every task of the job needs the same devices "
                "(a TFJob's chief and worker templates alike)"
            )
    for task in others:
        if layouts[task]["run_dir"] != layouts[chief]["run_dir"]:
            raise LayoutMismatch(
                f"multi_worker: {task} cannot see the run directory the chief {chief} writes "
                f"(--model-dir {model_dir}: the chief's start-up file is not there for it): "
                "every task needs --model-dir on storage they all share (a bucket, a shared "
                "volume)"
            )
