"""What configures a run, with no TensorFlow: the flag schema (`args`), the recipe file reader
(`config_file`), the checks (`validation`), the corpus lists (`corpora`), the automatic recipe
(`recipe`), the memory model (`memory`) and the plan that carries them (`plan`).

Nothing here imports TensorFlow at import time, so `kt-train --help` and flag errors answer
before TensorFlow loads (`memory.device_memory_gib` imports it when called).
"""
