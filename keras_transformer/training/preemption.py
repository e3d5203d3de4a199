"""Preemption: a SIGTERM (or Ctrl-C) to any worker makes every worker save at the same step
and exit.

Kubernetes, Vertex AI and cloud schedulers announce a preemption (or an eviction, or a
job being deleted) with SIGTERM and kill the process after a grace period (30 s by
default on Kubernetes: `terminationGracePeriodSeconds`). `PreemptionSave` turns the
signal into one more training step, a checkpoint at the same step on every worker (the
chief writes it) and exit status 143 (128 + SIGTERM, what schedulers treat as "killed,
restart me"); the restarted job resumes from that checkpoint exactly. SIGINT (Ctrl-C) is
handled the same way and exits with 130 (128 + SIGINT); a second Ctrl-C interrupts at once.

When the step that ends the run is an epoch's last batch (or the run's last step, or an
early stop), the save waits for that epoch's end work (validation, BLEU, `best/`, the
patience count, the epoch checkpoint), as the epoch checkpoint does
(`callbacks.CheckpointEvery`): the resumed run never skips an epoch's end. A signal that
arrives during the epoch-end work saves at that epoch's end on one machine.

This is the contract of TensorFlow's `tf.distribute.experimental.PreemptionCheckpointHandler`
(tensorflow/python/distribute/failure_handling/failure_handling.py), built on the same
primitive, the coordination service's key-value store, but keyed by the batches `fit`
consumed and independent of the platform: that handler watches GCE's maintenance events
instead of SIGTERM when the GCE metadata server answers (GKE and Vertex nodes) and does
nothing at all on GCE CPU machines.

The protocol (every worker runs the same steps in lockstep: each needs the others'
all-reduce to finish a step): the worker that receives SIGTERM after batch p publishes
"save after batch p + 1" under one key and waits until every worker acknowledged it (a
watcher thread on each worker waits on that key); no worker can finish batch p + 1
before the signalled one joins it, so all of them see the target in time. A second signal
elsewhere finds the key taken and follows it. Every wait is bounded (`ack_timeout`, 20 s
by default: below Kubernetes' 30 s grace period): a worker that does not acknowledge in
time is named in a logged error and the signalled worker saves (the chief) and exits
anyway, so a stuck task costs at most the batches since the last checkpoint, never a hang.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import keras
import tensorflow as tf

logger = logging.getLogger(__name__)

EXIT_CODE = 143  # 128 + SIGTERM: "terminated", restartable
EXIT_CODES = {signal.SIGTERM: EXIT_CODE, signal.SIGINT: 130}  # 128 + the signal's number
ACK_TIMEOUT = 20.0  # seconds: below Kubernetes' default 30 s grace period
_KEY = "keras_transformer_preemption_batch"
_STOP = "stop"
_POLL_MS = 1000  # the watcher's wait on the key, in bounded slices


class Preempted(SystemExit):
    """Raised after the preemption checkpoint: exits the process with status 143 (SIGTERM)
    or 130 (SIGINT)."""

    def __init__(self, message: str, code: int = EXIT_CODE):
        super().__init__(code)
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
    """Save at the same batch on every worker and exit with status 143 after a SIGTERM (130
    after a SIGINT).

    Args:
        strategy: the training strategy (multi-worker: the workers agree through
            TensorFlow's coordination service; otherwise this process alone).
        position: a callable returning the batches consumed so far (the same on every
            worker after every batch), e.g. `lambda: int(model.data_position.numpy())`.
        save: a callable that writes the checkpoint (the chief's; nothing elsewhere) and
            returns its path or None.
        ack_timeout: seconds the signalled worker waits for the others' acknowledgements
            (multi-worker) before it saves and exits without them.

    Call `close()` once training is over (stops the watcher thread, restores the previous
    signal handlers).
    """

    def __init__(self, strategy, position, save, ack_timeout: float = ACK_TIMEOUT):
        super().__init__()
        self.position, self.save, self.ack_timeout = position, save, ack_timeout
        self.cluster = _cluster(strategy)
        self.target: int | None = None  # save after this many batches
        self.received: int | None = None  # the first signal's number
        self.followed: int | None = None  # the signal of the worker whose target this is
        self.signalled = threading.Event()
        self.closing = threading.Event()
        self.announced = False
        self.watcher = None
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # Python's rule
            # None: the previous handler was not Python's (TensorFlow's coordination service
            # installs one that swallows the signal); the default is restored at close()
            for signum in EXIT_CODES:
                self.previous[signum] = signal.signal(signum, self._on_signal) or signal.SIG_DFL
        else:
            logger.warning("training outside the main thread: SIGTERM and SIGINT not handled")
        if self.cluster is not None:
            self.watcher = threading.Thread(
                target=self._watch, name="preemption-watcher", daemon=True
            )
            self.watcher.start()

    @property
    def signal_name(self) -> str:
        return signal.Signals(self._signum()).name

    def _signum(self) -> int:
        return self.received or self.followed or signal.SIGTERM

    # -- signal and watcher (any thread) ----------------------------------------------------

    def _on_signal(self, signum, frame):
        del frame
        if signum == signal.SIGINT and self.received == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now (kt-train: one line, 130)
        if self.received is None:
            self.received = signum
        self.signalled.set()

    def _context(self):
        from tensorflow.python.eager import context

        return context.context()

    def _get(self, key: str, timeout_s: float) -> str | None:
        """The key's value, or None when it is not set within `timeout_s` seconds."""
        try:
            return self._context().get_config_key_value(key, max(int(timeout_s * 1000), 1))
        except tf.errors.DeadlineExceededError:
            return None

    def _watch(self):
        value = None
        while value is None and not self.closing.is_set():  # bounded slices: close() ends it
            try:
                value = self._get(_KEY, _POLL_MS / 1000)
            except tf.errors.OpError as err:  # the coordination service is gone
                logger.info("preemption watcher: %s", str(err).splitlines()[0])
                return
        if value is None or value == _STOP:
            return
        target, _, signum = value.partition(":")  # "batch:signal", the signalled worker's
        self.followed = int(signum or signal.SIGTERM)
        self.target = int(target)  # before the acknowledgement: see the module docstring
        self._context().set_config_key_value(f"{_KEY}_ack_{self.cluster[0]}", "1")

    # -- the main thread --------------------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        position = self.position()
        if self.target is not None and position >= self.target and not self._epoch_ends(batch):
            self._save_and_exit(position)
        if self.signalled.is_set() and not self.announced:
            self.announced = True
            self._announce(position + 1, position)

    def on_epoch_end(self, epoch, logs=None):
        # the epoch-end work is done (the callbacks before this one): validation, BLEU,
        # best/, patience and the epoch checkpoint
        position = self.position()
        if self.target is not None and position >= self.target:
            self._save_and_exit(position)
        if self.signalled.is_set() and not self.announced:  # signalled during that work
            self.announced = True
            if self.cluster is None:
                logger.warning("%s received: saving now, then exiting", self.signal_name)
                self._save_and_exit(position)
            self._announce(position + 1, position)

    def _epoch_ends(self, batch: int) -> bool:
        """True when the epoch ends after this batch: the epoch's last batch, the run's last
        step or an early stop (`stop_training`, set by the callbacks before this one)."""
        steps = (self.params or {}).get("steps")
        return (steps is not None and batch + 1 >= steps) or bool(
            self.model is not None and self.model.stop_training
        )

    def _announce(self, target: int, position: int) -> None:
        logger.warning("%s received: saving after batch %d, then exiting", self.signal_name, target)
        if self.cluster is None:
            self.target = target
            return
        context = self._context()
        try:
            context.set_config_key_value(_KEY, f"{target}:{int(self._signum())}")
        except tf.errors.AlreadyExistsError:  # another worker was signalled first
            value = self._get(_KEY, self.ack_timeout)
            if value == _STOP:  # training is over anyway
                return
        deadline = time.monotonic() + self.ack_timeout
        missing = [
            task
            for task in range(self.cluster[1])  # every worker knows the target: go on
            if self._get(f"{_KEY}_ack_{task}", max(deadline - time.monotonic(), 0.001)) is None
        ]
        if missing:  # a stuck task: the next batch's collectives could hang, stop here
            tasks = ", ".join(str(task) for task in missing)
            logger.error(
                "preemption: task(s) %s did not acknowledge within %g s; saving after batch "
                "%d without them and exiting",
                tasks,
                self.ack_timeout,
                position,
            )
            self._save_and_exit(position)

    def _save_and_exit(self, position: int) -> None:
        path = self.save()
        name, code = self.signal_name, EXIT_CODES[self._signum()]
        message = (
            f"stopped by {name}: checkpoint {path} written after batch {position}; "
            f"exiting with status {code}, start the same command again to resume"
            if path
            else f"stopped by {name}: the chief saved after batch {position}; exiting ({code})"
        )
        logger.warning("%s", message)
        self.close()
        raise Preempted(message, code)

    def close(self) -> None:
        """Stop watching (training ended or this worker exits)."""
        self.closing.set()
        if self.watcher is not None:
            try:
                self._context().set_config_key_value(_KEY, _STOP)
            except tf.errors.AlreadyExistsError:
                pass
            except tf.errors.OpError as err:  # a peer already gone: nothing to tell it
                logger.info("preemption watcher: %s", err)
            self.watcher.join(timeout=2 * _POLL_MS / 1000)
            self.watcher = None
        for signum, previous in self.previous.items():
            signal.signal(signum, previous)
        self.previous = {}


__all__ = ["ACK_TIMEOUT", "EXIT_CODE", "EXIT_CODES", "Preempted", "PreemptionSave"]
