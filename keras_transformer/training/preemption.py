"""Preemption: a SIGTERM to any worker makes every worker save at the same step and exit.

Kubernetes, Vertex AI and cloud schedulers announce a preemption (or an eviction, or a
job being deleted) with SIGTERM and kill the process after a grace period (30 s by
default on Kubernetes: `terminationGracePeriodSeconds`). `PreemptionSave` turns the
signal into one more training step, a checkpoint at the same step on every worker (the
chief writes it) and exit status 143 (128 + SIGTERM, what schedulers treat as "killed,
restart me"); the restarted job resumes from that checkpoint exactly.

This is the contract of TensorFlow's `tf.distribute.experimental.PreemptionCheckpointHandler`
(tensorflow/python/distribute/failure_handling/failure_handling.py), built on the same
primitive, the coordination service's key-value store, but keyed by the batches `fit`
consumed and independent of the platform: that handler watches GCE's maintenance events
instead of SIGTERM when the GCE metadata server answers (GKE and Vertex nodes) and does
nothing at all on GCE CPU machines.

The protocol (every worker runs the same steps in lockstep: each needs the others'
all-reduce to finish a step): the worker that receives SIGTERM after batch p publishes
"save after batch p + 1" under one key and waits until every worker acknowledged it (a
watcher thread on each worker blocks on that key); no worker can finish batch p + 1
before the signalled one joins it, so all of them see the target in time. A second signal
elsewhere finds the key taken and follows it.
"""

from __future__ import annotations

import logging
import signal
import threading

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)

EXIT_CODE = 143  # 128 + SIGTERM: "terminated", restartable
_KEY = "keras_transformer_preemption_batch"
_STOP = "stop"


class Preempted(SystemExit):
    """Raised after the preemption checkpoint: exits the process with status 143."""

    def __init__(self, message: str):
        super().__init__(EXIT_CODE)
        self.message = message


def _cluster(strategy):
    """(this task's id in the cluster, number of training tasks), or None on one machine."""
    from tensorflow.python.distribute import multi_worker_util

    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type or not resolver.cluster_spec().jobs:
        return None
    spec = resolver.cluster_spec()
    return (
        multi_worker_util.id_in_cluster(spec, resolver.task_type, resolver.task_id),
        multi_worker_util.worker_count(spec, resolver.task_type),
    )


class PreemptionSave(keras.callbacks.Callback):
    """Save at the same batch on every worker and exit with status 143 after a SIGTERM.

    Args:
        strategy: the training strategy (multi-worker: the workers agree through
            TensorFlow's coordination service; otherwise this process alone).
        position: a callable returning the batches consumed so far (the same on every
            worker after every batch), e.g. `lambda: int(model.data_position.numpy())`.
        save: a callable that writes the checkpoint (the chief's; nothing elsewhere) and
            returns its path or None.

    Call `close()` once training is over (stops the watcher thread, restores the previous
    SIGTERM handler).
    """

    def __init__(self, strategy, position, save):
        super().__init__()
        self.position, self.save = position, save
        self.cluster = _cluster(strategy)
        self.target: int | None = None  # save after this many batches
        self.signalled = threading.Event()
        self.announced = False
        self.watcher = None
        self.previous = None
        if threading.current_thread() is threading.main_thread():  # Python's rule
            # None: the previous handler was not Python's (TensorFlow's coordination service
            # installs one that swallows the signal); the default is restored at close()
            self.previous = signal.signal(signal.SIGTERM, self._on_signal) or signal.SIG_DFL
        else:
            logger.warning("training outside the main thread: SIGTERM is not handled")
        if self.cluster is not None:
            self.watcher = threading.Thread(
                target=self._watch, name="preemption-watcher", daemon=True
            )
            self.watcher.start()

    # -- signal and watcher (any thread) ----------------------------------------------------

    def _on_signal(self, signum, frame):
        del signum, frame
        self.signalled.set()

    def _context(self):
        from tensorflow.python.eager import context

        return context.context()

    def _watch(self):
        value = self._context().get_config_key_value(_KEY)  # blocks until someone sets it
        if value == _STOP:
            return
        self.target = int(value)  # before the acknowledgement: see the module docstring
        self._context().set_config_key_value(f"{_KEY}_ack_{self.cluster[0]}", "1")

    # -- the main thread --------------------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        position = self.position()
        if self.target is not None and position >= self.target:
            self._save_and_exit(position)
        if self.signalled.is_set() and not self.announced:
            self.announced = True
            self._announce(position + 1)

    def _announce(self, target: int) -> None:
        logger.warning("SIGTERM received: saving after batch %d, then exiting", target)
        if self.cluster is None:
            self.target = target
            return
        context = self._context()
        try:
            context.set_config_key_value(_KEY, str(target))
        except tf.errors.AlreadyExistsError:  # another worker was signalled first
            if context.get_config_key_value(_KEY) == _STOP:  # training is over anyway
                return
        for task in range(self.cluster[1]):  # every worker knows the target: go on
            context.get_config_key_value(f"{_KEY}_ack_{task}")

    def _save_and_exit(self, position: int) -> None:
        path = self.save()
        message = (
            f"preempted (SIGTERM): checkpoint {path} written after batch {position}; "
            "exiting with status 143, start the same command again to resume"
            if path
            else f"preempted (SIGTERM): the chief saved after batch {position}; exiting (143)"
        )
        logger.warning("%s", message)
        self.close()
        raise Preempted(message)

    def close(self) -> None:
        """Stop watching (training ended or this worker exits)."""
        if self.watcher is not None:
            try:
                self._context().set_config_key_value(_KEY, _STOP)
            except tf.errors.AlreadyExistsError:
                pass
            except tf.errors.OpError as err:  # a peer already gone: nothing to tell it
                logger.info("preemption watcher: %s", err)
            self.watcher.join(timeout=10)
            self.watcher = None
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


__all__ = ["EXIT_CODE", "Preempted", "PreemptionSave"]
