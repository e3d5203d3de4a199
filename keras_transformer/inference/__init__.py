"""Inference: the search, the in-graph `Translator`, the SavedModel export for TF Serving,
evaluation with sacreBLEU, and the command lines behind them (`translate`, `evaluate`)."""

from keras_transformer.inference.translator import Translator

__all__ = ["Translator"]
