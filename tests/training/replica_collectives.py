"""Run as a script: the collective ops that one training step issues, counted in the graph of
the step traced under a collective-all-reduce strategy on 2 logical CPUs (the one
`--strategy multi_worker` uses; its ops are the ones NCCL runs on GPUs).

The strategy is `MultiWorkerMirroredStrategy` over the 2 local devices of this process; Keras
reduces the step's logs across workers only in multi-worker mode, which is forced for the
trace (nothing runs). The model is compiled as kt-train compiles it (training.model_state: a
masked accuracy metric; float16 with a loss scale). Prints JSON: per precision, the
collectives that replica 0 issues in a step: "gradients", the all-reduces of the gradients
(those in the step's `GRADIENTS_ALL_REDUCE` name scope and those in the optimizer's: Keras'
optimizer reduced them, a second reduction would count 2), and "scalars", all the others, by
op. Kept out of the pytest process because logical devices must be configured before
TensorFlow starts.
"""

import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras.src.backend.tensorflow import trainer as keras_trainer  # noqa: E402

from keras_transformer.training.step import GRADIENTS_ALL_REDUCE, TrainingModel  # noqa: E402
from keras_transformer.training.strategy import set_precision, split_cpu  # noqa: E402

split_cpu(2)
import keras_transformer as kt  # noqa: E402
from keras_transformer.losses import MaskedAccuracy  # noqa: E402

COLLECTIVES = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveReduce", "CollectiveGather"}


def batch():
    rng = np.random.default_rng(0)
    src = rng.integers(4, 60, size=(4, 9)).astype("int32")
    tgt = rng.integers(4, 60, size=(4, 8)).astype("int32")
    return (src, tgt[:, :-1]), tgt[:, 1:], np.arange(4, dtype="int64")


def count(graph_def, optimizer_scope: str) -> dict:
    """Replica 0's (CPU:0) collective ops in a graph and the functions it calls."""
    scopes = {optimizer_scope, GRADIENTS_ALL_REDUCE}
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes += list(function.node_def)
    ops = [n for n in nodes if n.op in COLLECTIVES and n.device.endswith("CPU:0")]
    gradients = [n for n in ops if scopes & set(n.name.split("/")[:-1])]
    scalars = collections.Counter(n.op for n in ops if n not in gradients)
    return {"gradients": len(gradients), "scalars": dict(scalars)}


def step_collectives(precision: str) -> dict:
    set_precision(precision)
    strategy = tf.distribute.MultiWorkerMirroredStrategy._from_local_devices(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        cfg = kt.TransformerConfig.preset("tiny", vocab_size=60, dropout_rate=0.0)
        model = TrainingModel(kt.Transformer(cfg))
        optimizer = kt.paper_optimizer(64, 10)
        model.compile(
            optimizer=optimizer, loss=kt.LabelSmoothedCrossEntropy(), metrics=[MaskedAccuracy()]
        )
        model.optimizer.build(model.transformer.trainable_variables)
    data = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch()))

    @tf.function
    def one_step(data):  # Keras' one_step_on_data (keras/src/backend/tensorflow/trainer.py)
        outputs = strategy.run(model.train_step, args=(data,))
        return keras_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

    multi_worker = keras_trainer._collective_all_reduce_multi_worker
    keras_trainer._collective_all_reduce_multi_worker = lambda _: True
    try:
        graph = one_step.get_concrete_function(data.element_spec).graph
    finally:
        keras_trainer._collective_all_reduce_multi_worker = multi_worker
    return {
        "replicas": strategy.num_replicas_in_sync,
        **count(graph.as_graph_def(), optimizer.name),
    }


print(json.dumps({p: step_collectives(p) for p in ("float32", "mixed_float16")}))
