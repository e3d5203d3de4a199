"""The exponential moving average of the weights (`--ema-decay`), kept by Keras' optimizer.

Keras 3's `use_ema` (`optimization.AveragingAdam`) updates one average per trained variable
inside the optimizer's `apply`, so it follows what the update does: it works under
MirroredStrategy, and with float16 loss scaling a skipped step leaves the average as it is
(the wrapped optimizer's `apply` is not called). Two things are left to the run:

- the averages are not tracked by `tf.train.Checkpoint` through the optimizer (Keras builds
  them without dependency tracking): `checkpoint_items` adds them as `ema`, so every
  checkpoint holds them and a resume restores them;
- validation and `best/` use them: `swapped` puts them into the model and puts the raw
  weights back afterwards, bit for bit (a copy, not Keras' add/subtract swap, which rounds).

A checkpoint's `ema/<i>` is the average of the model's i-th trainable variable;
`Run.restore_average` reads them for export.
"""

from __future__ import annotations

import contextlib

import keras

from keras_transformer.run_dir import EMA_KEY


def averages(optimizer) -> list | None:
    """The optimizer's moving averages (one per trainable variable, in the order of the
    variables it was built with), or None when it keeps none."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    if not getattr(inner, "use_ema", False):
        return None
    return list(inner._model_variables_moving_average)


def checkpoint_items(optimizer) -> dict:
    """`{"ema": averages}` for `tf.train.Checkpoint(**...)`, or {} without averaging."""
    found = averages(optimizer)
    return {} if found is None else {EMA_KEY: found}


@contextlib.contextmanager
def swapped(model: keras.Model, optimizer):
    """Within the block the model holds the averaged weights; afterwards the raw ones again,
    exactly. Without averaging, the block sees the model as it is."""
    found = averages(optimizer)
    if found is None:
        yield
        return
    variables = model.trainable_variables
    if len(variables) != len(found):
        raise ValueError(
            f"the optimizer averages {len(found)} variables, the model has {len(variables)}"
        )
    raw = [v.numpy().copy() for v in variables]
    try:
        for variable, average in zip(variables, found):
            variable.assign(average.value)
        yield
    finally:
        for variable, value in zip(variables, raw):
            variable.assign(value)


__all__ = ["averages", "checkpoint_items", "swapped"]
