"""Training: strategy and precision, the training step, callbacks, and the trainer behind
kt-train.

`settings.args` (the flags) imports no TensorFlow, so `kt-train --help` and flag errors answer
before TensorFlow loads; `TrainingModel` is imported on first use (PEP 562).
"""

__all__ = ["TrainingModel"]


def __getattr__(name):
    if name == "TrainingModel":
        from keras_transformer.training.step import TrainingModel

        return TrainingModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
