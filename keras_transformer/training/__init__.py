"""Training: strategy and precision, the training step, callbacks, and the trainer behind
train.py."""

from keras_transformer.training.step import TrainingModel

__all__ = ["TrainingModel"]
