"""Training throughput, workloads W1 and W2 of DESIGN.md section 7, against a stock-Keras baseline.

    python benchmarks/bench_train.py                 # W1 and W2, ours and the baseline
    python benchmarks/bench_train.py --workloads W1 --steps 30
    python benchmarks/bench_train.py --workloads W1 --impls ours --jit-compile   # XLA

Each (workload, implementation) runs in its own subprocess so that peak RSS and thread
pools are its own. Both implementations train through one `model.fit` call on the same
random batches (fixed seed) with the same loss (label smoothing 0.1) and optimizer (Adam
0.9/0.98/1e-9, warmup schedule). The baseline is the TensorFlow tutorial's architecture
built from stock `keras.layers.MultiHeadAttention` (with the paper's per-head depth
d_model/h, not the tutorial's d_model) and an untied output `Dense`.

Model FLOPs per training step = 3 x forward (backward ~ 2 x forward), forward =
2 x (B*S*P_enc + B*T*P_dec + B*T*d*V) + 4*B*d*N*(S^2 + T^2 + T*S), where P_enc and P_dec are
the per-token weight-matrix parameters of the encoder and decoder stacks (attention
projections and FFN), d = d_model, N = layers, V = vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from figures import add_record_flag, record

WORKLOADS = {
    "W1": dict(preset="small", vocab_size=8000, batch=64, src_len=24, tgt_len=24),
    "W2": dict(preset="base", vocab_size=32000, batch=32, src_len=32, tgt_len=32),
}


def model_flops_per_step(cfg, batch, src_len, tgt_len):
    d, f, n, v = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
    p_enc = n * (4 * d * d + 2 * d * f)
    p_dec = n * (8 * d * d + 2 * d * f)
    forward = 2 * (batch * src_len * p_enc + batch * tgt_len * p_dec + batch * tgt_len * d * v)
    forward += 4 * batch * d * n * (src_len**2 + tgt_len**2 + tgt_len * src_len)
    return 3 * forward


def build_baseline(cfg):
    """The TF tutorial's Transformer from stock Keras layers (per-head depth d_model/h)."""
    import keras
    import numpy as np
    import tensorflow as tf

    d, h, f, rate = cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout_rate
    angles = np.arange(512)[:, None] / np.power(10000, (2 * (np.arange(d)[None] // 2)) / d)
    pos = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], -1).astype("float32")

    class PositionalEmbedding(keras.layers.Layer):  # as in the tutorial
        def __init__(self):
            super().__init__()
            self.embedding = keras.layers.Embedding(cfg.vocab_size, d)

        def call(self, ids):
            x = self.embedding(ids) * tf.math.sqrt(tf.cast(d, tf.float32))
            return x + tf.constant(pos)[tf.newaxis, : tf.shape(ids)[1], :]

    def embed(ids):
        return keras.layers.Dropout(rate)(PositionalEmbedding()(ids))

    def ffn(x):
        y = keras.layers.Dense(f, activation="relu")(x)
        y = keras.layers.Dense(d)(y)
        return keras.layers.LayerNormalization()(
            keras.layers.Add()([x, keras.layers.Dropout(rate)(y)])
        )

    def attend(x, context, causal):
        y = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d // h, dropout=0.0)(
            query=x, value=context, key=context, use_causal_mask=causal
        )
        return keras.layers.LayerNormalization()(keras.layers.Add()([x, y]))

    src = keras.Input((None,), dtype="int32")
    tgt = keras.Input((None,), dtype="int32")
    x = embed(src)
    for _ in range(cfg.num_layers):
        x = ffn(attend(x, x, False))
    y = embed(tgt)
    for _ in range(cfg.num_layers):
        y = ffn(attend(attend(y, y, True), x, False))
    logits = keras.layers.Dense(cfg.vocab_size)(y)
    return keras.Model([src, tgt], logits)


def run_one(workload: str, impl: str, steps: int, warmup: int, xla: bool = False) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer.training.step import TrainingModel

    spec = WORKLOADS[workload]
    cfg = kt.TransformerConfig.preset(spec["preset"], vocab_size=spec["vocab_size"])
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    b, s, t = spec["batch"], spec["src_len"], spec["tgt_len"]
    src = rng.integers(4, cfg.vocab_size, size=(b, s)).astype("int32")
    tgt = rng.integers(4, cfg.vocab_size, size=(b, t + 1)).astype("int32")
    data = tf.data.Dataset.from_tensors(((src, tgt[:, :-1]), tgt[:, 1:])).repeat().prefetch(2)

    # ours: what train.py runs (the Transformer inside TrainingModel's token-level step)
    net = kt.Transformer(cfg) if impl == "ours" else build_baseline(cfg)
    model = TrainingModel(net) if impl == "ours" else net
    model.compile(
        optimizer=kt.paper_optimizer(cfg.d_model),
        loss=kt.LabelSmoothedCrossEntropy(cfg.label_smoothing),
        jit_compile=xla,  # ours: XLA per micro-batch (TrainingModel.compile)
    )

    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    start = time.perf_counter()
    model.fit(data, steps_per_epoch=warmup + steps, epochs=1, verbose=0, callbacks=[Clock()])
    steady = np.diff(times[warmup - 1 :])  # seconds per step after warmup
    step_s = float(np.median(steady))
    flops = model_flops_per_step(cfg, b, s, t)
    return {
        "workload": workload,
        "impl": impl,
        "xla": xla,
        "xla_programs": (
            int(model._compiled_micro_batch.experimental_get_tracing_count())
            if getattr(model, "_compiled_micro_batch", None) is not None
            else 0
        ),
        "params": int(net.count_params()),
        "step_s_median": round(step_s, 4),
        "target_tokens_per_s": round(b * t / step_s, 1),
        "model_gflops_per_s": round(flops / step_s / 1e9, 1),
        "first_step_s": round(times[0] - start, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "steps_timed": len(steady),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", nargs="+", default=["W1", "W2"], choices=sorted(WORKLOADS))
    parser.add_argument(
        "--impls", nargs="+", default=["baseline", "ours"], choices=["baseline", "ours"]
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    parser.add_argument("--jit-compile", action="store_true", help="XLA (jit_compile=True)")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "IMPL"), help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_one(*args.child, args.steps, args.warmup, args.jit_compile)))
        return
    results = []
    for workload in args.workloads:
        row = {}
        for impl in args.impls:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                workload,
                impl,
                "--steps",
                str(args.steps),
                "--warmup",
                str(args.warmup),
                *(["--jit-compile"] if args.jit_compile else []),
            ]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row[impl] = json.loads(out.strip().splitlines()[-1])
            results.append(row[impl])
            print(json.dumps(row[impl]), file=sys.stderr)
        if "ours" in row and "baseline" in row:
            ratio = row["ours"]["target_tokens_per_s"] / row["baseline"]["target_tokens_per_s"]
            results.append({"workload": workload, "speedup_vs_baseline": round(ratio, 2)})
    report = {"machine": f"{os.cpu_count()} CPU cores", "results": results}
    print(json.dumps(report, indent=2))
    record(args.record, report)


if __name__ == "__main__":
    main()
