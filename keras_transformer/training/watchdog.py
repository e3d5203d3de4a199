"""`--collective-timeout`: a progress watchdog in place of TensorFlow's per-collective timeout.

`CommunicationOptions(timeout_seconds=...)` makes TensorFlow start a sleeping thread per
collective for the whole timeout: two local workers with a 600 s timeout grew from 127 to
9,303 threads in 400 steps (about 22 a step a worker), so a fast job reaches the kernel's
thread limit. `ProgressWatchdog` is one thread per process: every training batch,
validation batch and epoch boundary is progress; when none comes for `timeout` seconds (a
peer died or hangs and a collective waits for it), it logs one line and ends the process
with status 1, so the scheduler restarts the job from its last checkpoint instead of
leaving it hung. The chief's validation BLEU reports no progress while it translates:
the timeout must be longer than one evaluation (as TensorFlow's was: the other workers wait
for the chief's decision to stop in a collective). The clock starts when the first training
batch ends: that batch traces the step (and compiles it under XLA), which takes minutes for a
big model and is not a hang; a peer lost before it is not caught.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import keras

logger = logging.getLogger(__name__)

EXIT_CODE = 1


class ProgressWatchdog(keras.callbacks.Callback):
    """Ends the process when training makes no progress for `timeout` seconds.

    Args:
        timeout: seconds without a batch or an epoch boundary, counted from the end of the
            first training batch (tracing and compilation are not timed).
        exit: called with the exit status when the time is up (default `os._exit`: the main
            thread is blocked in a collective, no exception would reach it).
    """

    def __init__(self, timeout: float, exit=os._exit):
        super().__init__()
        self.timeout, self.exit = float(timeout), exit
        self.last = None  # armed by the first training batch's end
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="progress-watchdog", daemon=True)
        self.thread.start()

    def on_train_batch_end(self, *args, **kwargs) -> None:
        """Progress; the first one arms the watchdog."""
        self.last = time.monotonic()

    def beat(self, *args, **kwargs) -> None:
        """Progress once armed: the clock starts again."""
        if self.last is not None:
            self.last = time.monotonic()

    on_epoch_begin = on_epoch_end = on_test_begin = on_test_batch_end = on_test_end = beat

    def _watch(self) -> None:
        while not self.stopping.wait(min(self.timeout / 4, 5.0)):
            last = self.last
            idle = 0.0 if last is None else time.monotonic() - last
            if idle > self.timeout:
                logger.error(
                    "no training progress in %.0f s (--collective-timeout %g): a peer is "
                    "gone or stuck; exiting with status %d to restart from the last checkpoint",
                    idle,
                    self.timeout,
                    EXIT_CODE,
                )
                for handler in logging.getLogger("keras_transformer").handlers:
                    try:
                        handler.flush()
                    except (OSError, ValueError):  # a closed stream must not keep us alive
                        pass
                self.exit(EXIT_CODE)
                return

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)


__all__ = ["ProgressWatchdog"]
