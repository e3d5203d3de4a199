"""Decoding throughput, workload W3 of DESIGN.md section 7, with a CTranslate2 reference.

    python benchmarks/bench_decode.py            # pip install -e ".[bench]" for CTranslate2

Small preset (vocab 8000) with random weights (fixed seed), 64 source sentences of 20
tokens, exactly 30 decoding steps (eos is not a candidate before the last step, where it is
forced: the search's min_length, as CTranslate2's min_decoding_length). Decoders:
  - uncached: every step re-runs the whole model on the prefix (the TF tutorial's way);
  - cached (Python): `beam_search` over `Transformer.decode_step` in one `tf.function`;
  - cached (SavedModel): the same function exported with ExportArchive and reloaded, at
    beam 4 and at beam 1 (greedy), the beam size being an input of the exported function;
  - CTranslate2 float32 (and int8), beam 4 and greedy: a post-norm Transformer of the same
    dimensions built through `ctranslate2.specs` with random weights, the same source token
    count, `min_decoding_length = max_decoding_length = 30`, `intra_threads` = CPU cores.
All of them are timed in interleaved rounds (each decoder once per round, in turn), so that
a slow spell of a shared machine falls on every decoder alike. Prints JSON: sentences/s
(median over the rounds), our export's speed relative to CTranslate2 float32 (the median of
the per-round ratios, and their range), peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BATCH, SRC_LEN, STEPS, BEAM, VOCAB, EOS = 64, 20, 30, 4, 8000, 3


def build_ctranslate2(out_dir: str, cfg, seed: int = 0) -> None:
    """A CTranslate2 post-norm Transformer with `cfg`'s dimensions and random weights."""
    import numpy as np
    from ctranslate2.specs import transformer_spec

    d, rng = cfg.d_model, np.random.default_rng(seed)
    spec = transformer_spec.TransformerSpec.from_config(
        cfg.num_layers, cfg.num_heads, pre_norm=cfg.norm_first
    )

    def linear(layer, out_dim, in_dim):
        scale = np.sqrt(2.0 / (out_dim + in_dim))
        layer.weight = (rng.standard_normal((out_dim, in_dim)) * scale).astype(np.float32)
        layer.bias = np.zeros(out_dim, np.float32)

    def norm(layer):
        layer.gamma, layer.beta = np.ones(d, np.float32), np.zeros(d, np.float32)

    embedding = (rng.standard_normal((cfg.vocab_size, d)) * d**-0.5).astype(np.float32)
    spec.encoder.embeddings[0].weight = embedding  # tied, as ours
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding
    spec.decoder.projection.bias = np.zeros(cfg.vocab_size, np.float32)
    for layer in spec.encoder.layer + spec.decoder.layer:
        norm(layer.self_attention.layer_norm)
        linear(layer.self_attention.linear[0], 3 * d, d)  # fused Q, K, V
        linear(layer.self_attention.linear[1], d, d)
        if hasattr(layer, "attention"):
            norm(layer.attention.layer_norm)
            linear(layer.attention.linear[0], d, d)
            linear(layer.attention.linear[1], 2 * d, d)  # fused K, V of the memory
            linear(layer.attention.linear[2], d, d)
        norm(layer.ffn.layer_norm)
        linear(layer.ffn.linear_0, cfg.d_ff, d)
        linear(layer.ffn.linear_1, d, cfg.d_ff)
    if cfg.norm_first:
        norm(spec.encoder.layer_norm)
        norm(spec.decoder.layer_norm)
    tokens = ["<blank>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, cfg.vocab_size)]
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization="float32")
    spec.save(out_dir)


def ctranslate2_decoders(cfg, source, model_dir: str) -> dict:
    """{name: run}: CTranslate2 float32 and int8, beam 4 and greedy, on the same source
    (each `run()` translates the batch), or {"ctranslate2": why not} if it is not installed.
    The model is written to `model_dir`."""
    try:
        import ctranslate2
    except ImportError:
        return {"ctranslate2": "not installed (pip install -e '.[bench]')"}
    tokens = [[f"t{i}" for i in row] for row in source.numpy()]
    os.makedirs(model_dir, exist_ok=True)
    build_ctranslate2(model_dir, cfg)
    decoders = {}
    for compute_type in ("float32", "int8"):
        translator = ctranslate2.Translator(
            model_dir,
            device="cpu",
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=os.cpu_count(),
        )
        for name, beam in (("beam4", BEAM), ("greedy", 1)):

            def run(beam=beam, translator=translator):
                out = translator.translate_batch(
                    tokens,
                    beam_size=beam,
                    length_penalty=0.6,
                    max_batch_size=BATCH,
                    min_decoding_length=STEPS,
                    max_decoding_length=STEPS,
                )
                assert all(len(r.hypotheses[0]) == STEPS for r in out), "not 30 steps"

            decoders[f"ctranslate2_{compute_type}_{name}"] = run
    decoders["ctranslate2_version"] = ctranslate2.__version__
    return decoders


def interleaved(decoders: dict, repeats: int) -> dict:
    """{name: [seconds per run]}: `repeats` rounds that run each decoder (already warmed up)
    once, in turn, so that a slow spell of a shared machine falls on all of them alike
    instead of on whichever ran then."""
    times = {name: [] for name in decoders}
    for _ in range(repeats):
        for name, run in decoders.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


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
        times.update(interleaved({"uncached": run}, args.uncached_repeats))

    with tempfile.TemporaryDirectory() as tmp:
        export_w3(model, cached, os.path.join(tmp, "export"))
        loaded = tf.saved_model.load(os.path.join(tmp, "export"))
        decoders = {
            f"savedmodel_{name}": ours(lambda s, beam=beam: loaded.decode(s, tf.constant(beam)))
            for name, beam in (("beam4", BEAM), ("greedy", 1))
        }
        if not args.no_python:
            run = tf.function(lambda s: named(cached(s)), input_signature=[spec])
            decoders["cached_python"] = ours(run)
        ids = loaded.decode(source, tf.constant(BEAM))["ids"].numpy()
        assert ids.shape[-1] == STEPS and np.all(ids[:, :, STEPS - 1] == EOS), "not 30 steps"
        for run in decoders.values():
            run()  # traced and warm before the RSS reading
        rss_ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        reference = {}
        if not args.no_ctranslate2:
            reference = ctranslate2_decoders(cfg, source, os.path.join(tmp, "ctranslate2"))
        notes = {k: v for k, v in reference.items() if isinstance(v, str)}
        for name, run in reference.items():
            if callable(run):
                run()  # warm
                decoders[name] = run
        times.update(interleaved(decoders, args.repeats))

    report = {
        "workload": "W3",
        "machine": f"{os.cpu_count()} CPU cores",
        "batch": BATCH,
        "source_tokens": SRC_LEN,
        "steps": STEPS,
        "beam": BEAM,
        "rounds": args.repeats,
        "threads": {"intra_op": args.intra_op, "inter_op": args.inter_op},
        "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset"),
        **{
            f"{name}_sentences_per_s": round(BATCH / float(np.median(runs)), 1)
            for name, runs in times.items()
        },
        **notes,
    }
    for name in ("beam4", "greedy"):
        reference_runs = times.get(f"ctranslate2_float32_{name}")
        if reference_runs:
            # the ratio within each round, then its median (and range): both decoders ran
            # back to back, on the same machine state
            ratios = np.array(reference_runs) / np.array(times[f"savedmodel_{name}"])
            key = f"savedmodel_vs_ctranslate2_float32_{name}"
            report[key] = round(float(np.median(ratios)), 2)
            report[f"{key}_range"] = [round(float(ratios.min()), 2), round(float(ratios.max()), 2)]
    if "uncached" in times:
        report["speedup_savedmodel_vs_uncached"] = round(
            float(np.median(times["uncached"]) / np.median(times["savedmodel_beam4"])), 2
        )
    report["peak_rss_mb_before_ctranslate2"] = round(rss_ours, 1)
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
