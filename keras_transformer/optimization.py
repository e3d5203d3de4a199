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


def paper_optimizer(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0, clipnorm: float | None = None
) -> keras.optimizers.Adam:
    """Adam with beta_1 0.9, beta_2 0.98, epsilon 1e-9 on the warmup schedule."""
    return keras.optimizers.Adam(
        learning_rate=WarmupSchedule(d_model, warmup_steps, scale),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        clipnorm=clipnorm,
    )
