"""Decoding throughput, workload W3 of DESIGN.md section 7, with a CTranslate2 reference.

    python benchmarks/bench_decode.py            # pip install -e ".[bench]" for CTranslate2

Small preset (vocab 8000) with random weights (fixed seed), 64 source sentences of 20
tokens, exactly 30 decoding steps (eos is not a candidate before the last step, where it is
forced: the search's min_length, as CTranslate2's min_decoding_length). Decoders:
  - uncached: every step re-runs the whole model on the prefix (the TF tutorial's way);
  - cached (Python): `beam_search` over `Transformer.decode_step` in one `tf.function`;
  - cached (SavedModel): the same function exported with ExportArchive and reloaded, at
    beam 4 and at beam 1 (greedy), the beam size being an input of the exported function;
  - CTranslate2 float32 and int8, beam 4 and greedy: OUR random weights written through
    `ctranslate2.specs` (benchmarks/reference.py), the same source tokens,
    `min_decoding_length = max_decoding_length = 30`, `intra_threads` = CPU cores, each
    compute type in a process of its own (a second `Translator` in a process slows the
    first one down).
All of them are timed in interleaved rounds (each decoder once per round, in turn), so that
a slow spell of a shared machine falls on every decoder alike. Prints JSON: sentences/s
(median over the rounds), our export's speed relative to CTranslate2 float32 (the median of
the per-round ratios, and their range) and to int8, the CPU's ISA flags, our peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from figures import add_record_flag, record  # noqa: E402
from reference import Local, Worker, interleaved, isa_flags, ratios, write_ctranslate2  # noqa: E402

BATCH, SRC_LEN, STEPS, BEAM, VOCAB, EOS = 64, 20, 30, 4, 8000, 3


def ctranslate2_w3(model_dir: str, compute_type: str, source: list[list[int]]) -> dict:
    """{"beam4": run, "greedy": run}: CTranslate2 with `compute_type` on the W3 source,
    exactly STEPS steps (built in its own process: see reference.Worker)."""
    from reference import ctranslate2_translator

    translator = ctranslate2_translator(model_dir, compute_type)
    tokens = [[f"t{i}" for i in row] for row in source]

    def run(beam):
        out = translator.translate_batch(
            tokens,
            beam_size=beam,
            length_penalty=0.6,
            max_batch_size=BATCH,
            min_decoding_length=STEPS,
            max_decoding_length=STEPS,
        )
        assert all(len(r.hypotheses[0]) == STEPS for r in out), "not 30 steps"

    return {"beam4": lambda: run(BEAM), "greedy": lambda: run(1)}


def ctranslate2_workers(model, source, model_dir: str) -> dict:
    """{name: (worker, decoder)}: CTranslate2 float32 and int8, beam 4 and greedy, each
    compute type in a process of its own, running `model`'s own weights (written to
    `model_dir`); or {"ctranslate2": why not} if it is not installed."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return {"ctranslate2": "not installed (pip install -e '.[bench]')"}
    tokens = [f"t{i}" for i in range(model.config.vocab_size)]
    # W3's 20 random ids are the whole source on both sides: no eos appended
    write_ctranslate2(model, tokens, model_dir, SRC_LEN + STEPS + 8, source_eos=False)
    rows = source.numpy().tolist()
    decoders = {}
    for compute_type in ("float32", "int8"):
        worker = Worker(ctranslate2_w3, model_dir=model_dir, compute_type=compute_type, source=rows)
        for name in ("beam4", "greedy"):
            decoders[f"ctranslate2_{compute_type}_{name}"] = (worker, name)
    return decoders


def w3():
    """(cfg, model, source, cached, uncached): the small preset with random weights (seed 0),
    the 64 x 20 source, and the two decoders as functions of a (B, 20) int32 source
    (`cached` also takes the beam size; both run exactly STEPS steps)."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.inference.search import beam_search

    keras.utils.set_random_seed(0)
    cfg = kt.TransformerConfig.preset("small", vocab_size=VOCAB)
    model = kt.Transformer(cfg)
    model.build()
    rng = np.random.default_rng(0)
    source = tf.constant(rng.integers(4, VOCAB, size=(BATCH, SRC_LEN)).astype("int32"))

    def cached(src, beam=BEAM):
        memory = model.encode(src)
        cache = model.init_cache(memory, src)
        batch = tf.shape(src)[0]
        return beam_search(
            model.decode_step,
            tf.fill([batch], 2),
            cache,
            tf.fill([batch], STEPS),
            EOS,
            beam_size=beam,
            alpha=0.6,
            min_length=STEPS,
        )

    def uncached(src):
        def step_fn(ids, step, cache):
            prefix = tf.where(
                tf.range(STEPS + 1) == step, ids[:, tf.newaxis], cache["decoder"]["prefix"]
            )
            src = tf.repeat(cache["sentence"]["src"], BEAM, axis=0)  # one row per sentence
            logits = model((src, prefix[:, : step + 1]), training=False)[:, -1]
            return logits, {"decoder": {"prefix": prefix}, "sentence": cache["sentence"]}

        cache = {
            "decoder": {"prefix": tf.zeros([BATCH, STEPS + 1], tf.int32)},
            "sentence": {"src": src},
        }
        bos, max_lengths = tf.fill([BATCH], 2), tf.fill([BATCH], STEPS)
        return beam_search(
            step_fn, bos, cache, max_lengths, EOS, beam_size=BEAM, alpha=0.6, min_length=STEPS
        )

    return cfg, model, source, cached, uncached


def named(outputs) -> dict:
    """A search's (ids, scores) as the {"ids", "scores"} of the exported endpoint."""
    return dict(zip(("ids", "scores"), outputs))


def export_w3(model, cached, path: str) -> None:
    """Export `cached` as the SavedModel endpoint (and signature) "decode":
    (src (B, 20) int32, beam scalar int32) -> {"ids", "scores"}."""
    import keras
    import tensorflow as tf

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "decode",
        lambda src, beam: named(cached(src, beam)),
        input_signature=[
            tf.TensorSpec([None, SRC_LEN], tf.int32, name="src"),
            tf.TensorSpec([], tf.int32, name="beam"),
        ],
    )
    archive.write_out(path, verbose=False)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7, help="rounds of interleaved runs")
    parser.add_argument("--uncached-repeats", type=int, default=2, help="0 skips it")
    parser.add_argument("--no-python", action="store_true", help="skip the Python decoder")
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the reference")
    parser.add_argument("--intra-op", type=int, default=0, help="TF intra-op threads (0: TF's)")
    parser.add_argument("--inter-op", type=int, default=0, help="TF inter-op threads (0: TF's)")
    add_record_flag(parser)
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf

    # what TF Serving's --tensorflow_intra_op_parallelism / _inter_op_ set for a model
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)

    cfg, model, source, cached, uncached = w3()
    spec = tf.TensorSpec([None, SRC_LEN], tf.int32)

    def ours(fn):
        return lambda: fn(source)["ids"].numpy()

    times = {}
    if args.uncached_repeats:  # ~10x slower than the rest: timed on its own
        run = ours(tf.function(lambda s: named(uncached(s)), input_signature=[spec]))
        run()  # traced and warm
        times.update(interleaved({"uncached": (Local({"run": run}), "run")}, args.uncached_repeats))

    with tempfile.TemporaryDirectory() as tmp:
        export_w3(model, cached, os.path.join(tmp, "export"))
        loaded = tf.saved_model.load(os.path.join(tmp, "export"))
        local = {
            f"savedmodel_{name}": ours(lambda s, beam=beam: loaded.decode(s, tf.constant(beam)))
            for name, beam in (("beam4", BEAM), ("greedy", 1))
        }
        if not args.no_python:
            run = tf.function(lambda s: named(cached(s)), input_signature=[spec])
            local["cached_python"] = ours(run)
        ids = loaded.decode(source, tf.constant(BEAM))["ids"].numpy()
        assert ids.shape[-1] == STEPS and np.all(ids[:, :, STEPS - 1] == EOS), "not 30 steps"
        for run in local.values():
            run()  # traced and warm before the RSS reading
        rss_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        here = Local(local)
        decoders = {name: (here, name) for name in local}
        reference = {}
        if not args.no_ctranslate2:
            reference = ctranslate2_workers(model, source, os.path.join(tmp, "ctranslate2"))
        notes = {k: v for k, v in reference.items() if isinstance(v, str)}
        workers = {v[0] for v in reference.values() if isinstance(v, tuple)}
        try:
            for name, (worker, decoder) in (i for i in reference.items() if i[0] not in notes):
                worker.run(decoder)  # warm
                decoders[name] = (worker, decoder)
            times.update(interleaved(decoders, args.repeats))
        finally:
            for worker in workers:
                worker.close()

    report = {
        "workload": "W3",
        "command": "python benchmarks/bench_decode.py " + " ".join(argv or sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPU cores",
        "isa_flags": isa_flags(),
        "batch": BATCH,
        "source_tokens": SRC_LEN,
        "steps": STEPS,
        "beam": BEAM,
        "rounds": args.repeats,
        "threads": {"intra_op": args.intra_op, "inter_op": args.inter_op},
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"),
        "ctranslate2": "each compute type in a process of its own, the same weights as ours",
        **{
            f"{name}_sentences_per_s": round(BATCH / float(np.median(runs)), 1)
            for name, runs in times.items()
        },
        **notes,
    }
    for name in ("beam4", "greedy"):
        for compute_type in ("float32", "int8"):
            if f"ctranslate2_{compute_type}_{name}" in times:
                # the ratio within each round, then its median (and range): both decoders
                # ran back to back, on the same machine state
                report[f"savedmodel_vs_ctranslate2_{compute_type}_{name}"] = ratios(
                    times, f"savedmodel_{name}", f"ctranslate2_{compute_type}_{name}"
                )
    if "uncached" in times:
        report["speedup_savedmodel_vs_uncached"] = round(
            float(np.median(times["uncached"]) / np.median(times["savedmodel_beam4"])), 2
        )
    report["peak_rss_mb_ours"] = round(rss_ours, 1)
    print(json.dumps(report, indent=2))
    record(args.record, report)


if __name__ == "__main__":
    main()
