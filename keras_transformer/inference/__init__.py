"""Inference: the search, the in-graph `Translator`, the SavedModel export for TF Serving,
evaluation with sacreBLEU, and the command lines behind them (`translate`, `evaluate`,
`score`). Nothing is imported here, so that each command parses its flags before TensorFlow
starts; `keras_transformer.Translator` is the public name."""
