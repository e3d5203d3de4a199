"""The paper's optimizer (section 5.3): Adam(0.9, 0.98, 1e-9) and the warmup schedule, eq. (3)."""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Steps count from 1 (the optimizer's iteration 0 is step 1). `scale` is 1 in the paper.

    Args:
        d_model: model width.
        warmup_steps: paper: 4000.
        scale: a multiplier on the whole schedule.
    """

    def __init__(self, d_model: int, warmup_steps: int = 4000, scale: float = 1.0):
        if d_model <= 0 or warmup_steps <= 0 or scale <= 0:
            raise ValueError(
                f"d_model, warmup_steps and scale must be positive, got {d_model}, {warmup_steps}, {scale}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        rsqrt = tf.math.rsqrt(step)
        ramp = step * (self.warmup_steps**-1.5)
        return self.scale * (self.d_model**-0.5) * tf.minimum(rsqrt, ramp)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


@keras.saving.register_keras_serializable(package="keras_transformer")
class AveragingAdam(keras.optimizers.Adam):
    """Keras' Adam with `use_ema`, whose `fit` leaves the raw weights in the model.

    Keras keeps the moving average of every trained variable
    (`_model_variables_moving_average`, updated after each applied update, the first one
    copying the weights) and, at the end of every `fit` call, `finalize_variable_values`
    overwrites the model's weights with it. `kt-train` calls `fit` more than once in a run
    (a resumed run first finishes its epoch) and must go on from the raw weights, so that
    overwrite is a no-op here; the averaged weights are swapped in explicitly for validation
    and read from the checkpoints for export (`training.ema`).
    """

    def finalize_variable_values(self, var_list):
        del var_list  # the raw weights stay; see the class docstring


def paper_optimizer(
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    clipnorm: float | None = None,
    ema_decay: float | None = None,
) -> keras.optimizers.Adam:
    """Adam with beta_1 0.9, beta_2 0.98, epsilon 1e-9 on the warmup schedule.

    `ema_decay` (not in the paper) also keeps an exponential moving average of the weights,
    `average = ema_decay * average + (1 - ema_decay) * weights` after every update
    (`AveragingAdam`).
    """
    options = dict(
        learning_rate=WarmupSchedule(d_model, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        clipnorm=clipnorm,
    )
    if ema_decay is None:
        return keras.optimizers.Adam(**options)
    return AveragingAdam(use_ema=True, ema_momentum=ema_decay, **options)
