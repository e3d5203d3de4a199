"""Decoding throughput, workload W3 of DESIGN.md section 7.

    python benchmarks/bench_decode.py

Small preset (vocab 8000) with random weights (fixed seed), 64 source sentences of 20
tokens, beam 4, exactly 30 decoding steps (eos is suppressed before the last step, where
it is forced). Three decoders in the same run, each through one `tf.function`:
  - uncached: every step re-runs the whole model on the prefix (the TF tutorial's way);
  - cached (Python): `beam_search` over `Transformer.decode_step` with the fixed-size cache;
  - cached (SavedModel): the same function exported with ExportArchive and reloaded.
Prints JSON: sentences/s (median of --repeats runs) and the speed-up over uncached.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH, SRC_LEN, STEPS, BEAM, VOCAB = 64, 20, 30, 4, 8000


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--uncached-repeats", type=int, default=2)
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.decoding import NEG_INF, beam_search

    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset("small", vocab_size=VOCAB)
    model = kt.Transformer(cfg)
    model.build()
    rng = np.random.default_rng(0)
    source = tf.constant(rng.integers(4, VOCAB, size=(BATCH, SRC_LEN)).astype("int32"))
    eos = 3
    not_eos = tf.not_equal(tf.range(VOCAB), eos)[tf.newaxis]

    def exactly(step_fn):
        """Suppress eos before the last step so every hypothesis runs STEPS steps."""

        def wrapped(ids, step, cache):
            logits, cache = step_fn(ids, step, cache)
            allowed = tf.logical_or(not_eos, step >= STEPS - 1)
            return tf.where(allowed, logits, NEG_INF), cache

        return wrapped

    max_lengths = tf.fill([BATCH], STEPS)
    bos = tf.fill([BATCH], 2)

    def cached(src):
        memory = model.encode(src)
        cache = model.init_cache(memory, src, STEPS)
        ids, scores = beam_search(
            exactly(model.decode_step),
            tf.fill([tf.shape(src)[0]], 2),
            cache,
            tf.fill([tf.shape(src)[0]], STEPS),
            eos,
            beam_size=BEAM,
            alpha=0.6,
        )
        return ids, scores

    def uncached(src):
        def step_fn(ids, step, cache):
            prefix = tf.where(
                tf.range(STEPS + 1) == step, ids[:, tf.newaxis], cache["decoder"]["prefix"]
            )
            logits = model((cache["static"]["src"], prefix[:, : step + 1]), training=False)[:, -1]
            return logits, {"decoder": {"prefix": prefix}, "static": cache["static"]}

        cache = {
            "decoder": {"prefix": tf.zeros([BATCH, STEPS + 1], tf.int32)},
            "static": {"src": src},
        }
        return beam_search(
            exactly(step_fn), bos, cache, max_lengths, eos, beam_size=BEAM, alpha=0.6
        )

    spec = tf.TensorSpec([None, SRC_LEN], tf.int32)
    cached_fn = tf.function(cached, input_signature=[spec])
    uncached_fn = tf.function(uncached, input_signature=[spec])

    def timed(fn, repeats):
        def once():
            out = fn(source)
            return (out[0] if isinstance(out, tuple) else out["ids"]).numpy()

        once()  # trace and warm up
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            once()
            runs.append(time.perf_counter() - start)
        return float(np.median(runs))

    results = {}
    results["uncached"] = timed(uncached_fn, args.uncached_repeats)
    results["cached_python"] = timed(cached_fn, args.repeats)

    with tempfile.TemporaryDirectory() as tmp:
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint(
            "decode", lambda src: dict(zip(("ids", "scores"), cached(src))), input_signature=[spec]
        )
        archive.write_out(tmp, verbose=False)
        loaded = tf.saved_model.load(tmp)
        results["cached_savedmodel"] = timed(lambda s: loaded.decode(s), args.repeats)
        ids = loaded.decode(source)["ids"].numpy()
    assert ids.shape[-1] == STEPS and np.all(ids[:, :, STEPS - 1] == eos), "not exactly 30 steps"

    report = {
        "workload": "W3",
        "machine": f"{os.cpu_count()} CPU cores",
        "batch": BATCH,
        "source_tokens": SRC_LEN,
        "steps": STEPS,
        "beam": BEAM,
        **{
            f"{name}_sentences_per_s": round(BATCH / seconds, 1)
            for name, seconds in results.items()
        },
        "speedup_savedmodel_vs_uncached": round(
            results["uncached"] / results["cached_savedmodel"], 2
        ),
        "speedup_python_vs_uncached": round(results["uncached"] / results["cached_python"], 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
