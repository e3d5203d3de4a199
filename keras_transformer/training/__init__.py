"""Training: strategy and precision, callbacks, and the trainer behind train.py."""
