"""Run as a script: `--jit-compile` training on 2 logical CPUs (MirroredStrategy) over one
pass of a corpus cut into 7 chunks, counting XLA's compilations from XLA itself: every HLO
module XLA compiles is dumped (XLA_FLAGS=--xla_dump_to, one directory per run). Two runs:
kt-train's static rows (`static_rows` = replicas x accumulation steps) and the batches
without them. Prints JSON. Usage: xla_compiles.py MULTI30K_DIR WORK_DIR
"""

import glob
import gzip
import json
import os
import re
import sys

MULTI30K, WORK = sys.argv[1], sys.argv[2]
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
# one dump directory for the process; each run reads the modules added during it
os.environ["XLA_FLAGS"] = f"--xla_dump_to={os.path.join(WORK, 'xla')} --xla_dump_hlo_as_text"

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer.training.strategy import make_strategy, split_cpu  # noqa: E402

split_cpu(2)
import keras_transformer as kt  # noqa: E402
from keras_transformer.data import (  # noqa: E402
    SubwordTokenizer,
    bucket_boundaries,
    load_parallel,
    train_sentencepiece,
    training_batches,
)
from keras_transformer.data.pipeline import POSITION_BITS  # noqa: E402
from keras_transformer.training.step import TrainingModel  # noqa: E402

MAX_LENGTH, BATCH_TOKENS, CHUNK_PAIRS, REPLICAS = 32, 960, 150, 2  # 960: even rows per bucket


def corpus():
    """Multi30k's 1014 validation pairs in two files (7 chunks of 150 pairs per pass)."""
    files = []
    for lang in ("en", "de"):
        with gzip.open(os.path.join(MULTI30K, f"val.{lang}.gz"), "rt", encoding="utf-8") as f:
            text = f.read()
        files.append(os.path.join(WORK, f"c.{lang}"))
        with open(files[-1], "w", encoding="utf-8") as out:
            out.write(text)
    lines = [line for path in files for line in open(path, encoding="utf-8")]
    proto = train_sentencepiece([line.strip() for line in lines], 400)
    return load_parallel("files", "train", "en", "de", files=tuple(files)), proto


def compiled_modules() -> set[str]:
    """The HLO modules XLA compiled so far (one optimized module per compilation)."""
    return set(glob.glob(os.path.join(WORK, "xla", "*.cpu_after_optimizations.txt")))


def entry_shapes(paths) -> set[str]:
    """The parameter shapes of the compiled modules' entry computations (int32 ids)."""
    shapes = set()
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        entry = text[text.index("ENTRY") :].split("\n", 1)[0]
        shapes.add(" ".join(sorted(set(re.findall(r"s32\[\d+,\d+\]", entry)))))
    return shapes


def train(text, proto, static_rows):
    keras.utils.set_random_seed(0)  # before the tokenizer: it clears the kernel cache
    tokenizer = SubwordTokenizer(proto)
    data = training_batches(
        text,
        tokenizer,
        batch_tokens=BATCH_TOKENS,
        max_length=MAX_LENGTH,
        seed=1,
        positions=True,
        chunk_pairs=CHUNK_PAIRS,
        static_rows=static_rows,
    ).take_while(lambda inputs, target, position: position[0] < (1 << POSITION_BITS))
    with strategy.scope():
        cfg = kt.TransformerConfig.preset("tiny", num_layers=1, vocab_size=400, dropout_rate=0.0)
        transformer = kt.Transformer(cfg)
        transformer.build()
        model = TrainingModel(transformer)
        model.compile(
            optimizer=keras.optimizers.SGD(0.5),
            loss=kt.LabelSmoothedCrossEntropy(),
            jit_compile=True,
        )
    before = compiled_modules()
    history = model.fit(data, epochs=1, verbose=0)
    modules = compiled_modules() - before
    return {
        "weights": transformer.get_weights(),
        "loss": history.history["loss"][0],
        "steps": int(model.optimizer.iterations.numpy()),
        "compilations": len(modules),
        "shapes": sorted(entry_shapes(modules)),
        "chunks": -(-text.num_pairs // CHUNK_PAIRS),
    }


strategy = make_strategy("mirrored")  # before the tokenizer's resource (as kt-train)
text, proto = corpus()
static = train(text, proto, static_rows=REPLICAS)
unpadded = train(text, proto, static_rows=None)
print(
    json.dumps(
        {
            "buckets": len(bucket_boundaries(MAX_LENGTH)),
            "replicas": REPLICAS,
            **{
                f"{key}_{name}": run[key]
                for name, run in (("static", static), ("unpadded", unpadded))
                for key in ("loss", "steps", "compilations", "shapes", "chunks")
            },  # fmt: skip
            "max_weight_diff": max(
                float(np.max(np.abs(a - b))) for a, b in zip(static["weights"], unpadded["weights"])
            ),
        }
    )
)
sys.stdout.flush()
