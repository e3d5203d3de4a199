"""Inference: the search, the in-graph `Translator`, the SavedModel export for TF Serving,
and evaluation with sacreBLEU (the commands over them live in `keras_transformer.cli`).
Nothing is imported here, so that each command parses its flags before TensorFlow starts;
`keras_transformer.Translator` is the public name."""
