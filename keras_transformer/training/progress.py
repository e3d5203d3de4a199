"""Progress lines for logs: one line every N updates when Keras' progress bar is not drawn
(stdout not a terminal: nohup, `| tee`, CI, Slurm), fairseq's `--log-interval` habit."""

from __future__ import annotations

import logging
import time

import keras

from keras_transformer.training.callback_state import StepState, learning_rate, scalars

logger = logging.getLogger(__name__)


def duration(seconds: float) -> str:
    """`1h02m03s`, `2m03s`, `3s`."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressLog(keras.callbacks.Callback):
    """Logs `step 400/3020 | loss 5.123 | lr 3.10e-04 | 2,165 tok/s | elapsed 3m05s |
    ETA 20m10s` every `every` optimizer steps and at the last one.

    loss: the epoch's running mean of Keras' logs (as the epoch line and metrics.jsonl show);
    lr: the optimizer's current learning rate (as metrics.jsonl); tok/s: real (non-pad)
    target tokens, counted by the loss metric's token weights, over the training time of the
    steps since the last line (BLEU evaluations and checkpoints between steps excluded);
    ETA: the steps left times the wall-clock time per step of this process (evaluations
    included). Only reads what the step already computed: the weights are untouched.
    """

    def __init__(self, state: StepState, total: int, every: int, clock=time.monotonic, count=None):
        super().__init__()
        self.state, self.total, self.every, self.clock = state, total, every, clock
        self.count = count or token_count  # (model) -> the loss metric's tokens this epoch
        self.start = self.first_step = None
        self.counted = 0.0  # the loss metric's token count at the last reading (this epoch)
        self.tokens = self.busy = 0.0  # since the last line
        self.batch_start = 0.0
        self.logged = None  # the step of the last line (a skipped float16 step repeats it)

    def on_train_begin(self, logs=None):
        if self.start is None:  # `fit_to_step` may call `fit` several times
            self.start, self.first_step = self.clock(), self.state.step

    def on_epoch_begin(self, epoch, logs=None):
        self.counted = 0.0  # Keras resets the metrics before every epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_start = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        self.busy += self.clock() - self.batch_start
        step = self.state.step
        last_of_epoch = batch + 1 == (self.params or {}).get("steps")
        due = (self.every and step % self.every == 0) or step >= self.total
        if due and step != self.logged:
            self.count_tokens()
            self.log(step, logs)
        elif last_of_epoch:  # read before Keras resets the metric
            self.count_tokens()

    def count_tokens(self) -> None:
        counted = self.count(self.model)
        self.tokens += counted - self.counted
        self.counted = counted

    def log(self, step: int, logs) -> None:
        now = self.clock()
        elapsed = now - self.start
        done = step - self.first_step
        eta = elapsed / done * (self.total - step) if done > 0 else 0.0
        rate = self.tokens / self.busy if self.busy > 0 else 0.0
        loss = scalars(logs).get("loss", float("nan"))
        logger.info(
            "step %d/%d | loss %.3f | lr %.2e | %s tok/s | elapsed %s | ETA %s",
            step, self.total, loss, learning_rate(self.model.optimizer), f"{rate:,.0f}",
            duration(elapsed), duration(eta),
        )  # fmt: skip
        self.tokens = self.busy = 0.0
        self.logged = step


def token_count(model) -> float:
    """The real target tokens behind the loss metric's mean this epoch (its summed token
    weights: `TrainingModel._record_loss`), from this process's replicas only: no collective
    (a multi-worker run scales the chief's count by the number of workers' replicas)."""
    metric = next(m for m in model.metrics if m.name == "loss")
    strategy = model.distribute_strategy
    variable = getattr(metric.count, "value", metric.count)
    local = strategy.experimental_local_results(variable)
    share = strategy.num_replicas_in_sync / len(local)
    return float(sum(float(v.numpy()) for v in local)) * share


__all__ = ["ProgressLog", "duration", "token_count"]
