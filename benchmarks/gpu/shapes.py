"""kt-train's operating point for bench_gpu.py --mode kt-train: the token budget as kt-train's
recipe resolves it for the replicas at hand, and batches of the shapes kt-train's pipeline
cuts from a real corpus, partial batches at every chunk's end included.

The budget is strong scaling, as in kt-train: the update's tokens are fixed (the recipe's
25,000 for a large corpus, or --batch-tokens / --tokens-per-replica as given) and shared by
the replicas, so each replica's share shrinks as replicas are added
(`settings.recipe.sizes`, with --micro-batch-memory read from the GPU as kt-train does).

The shapes: each pair's length in pieces, from a run's own tokenizer (--tokenizer RUN_DIR:
its spm.model, as kt-train tokenizes) or estimated from its words (--pieces-per-word), plus
eos (source) and bos (target); pairs over --max-length are dropped. Chunks of --chunk-pairs pairs, each shuffled, are bucketed by the pipeline's own
`data.batching._bucket` (the same boundaries, budget and, with XLA, static rows), so every
chunk ends with a partial batch per bucket as kt-train's do. The ids are random.
"""

from __future__ import annotations

import dataclasses
import gzip

import numpy as np


def operating_point(opts, replicas: int) -> dict:
    """kt-train's resolved budget for `replicas` replicas: the update's tokens, the
    micro-batch's (all replicas), the accumulation steps and one replica's share."""
    from keras_transformer.settings.args import TrainArgs
    from keras_transformer.settings.recipe import sizes

    args = dataclasses.replace(
        TrainArgs(),
        preset=opts.preset,
        vocab_size=opts.vocab_size,
        precision=opts.precision,
        max_length=opts.max_length,
        batch_tokens=opts.batch_tokens,
        accum_steps=opts.accum_steps,
        tokens_per_replica=opts.tokens_per_replica,
        micro_batch_memory=opts.micro_batch_memory,
    )
    settings = sizes(args, num_pairs=opts.recipe_pairs, replicas=replicas).settings
    return {
        "vocab_size": settings.vocab_size,
        "update_tokens": settings.batch_tokens * settings.accum_steps,
        "batch_tokens": settings.batch_tokens,
        "accum_steps": settings.accum_steps,
        "tokens_per_replica": settings.batch_tokens // replicas,
        "micro_batch_memory_gib": settings.micro_batch_memory,
    }


def read_lines(path: str, limit: int | None) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as text:
        lines = []
        for line in text:
            lines.append(line)
            if limit and len(lines) >= limit:
                break
    return lines


def pair_lengths(opts) -> np.ndarray:
    """(pairs, 2) source and target-input lengths in pieces of the corpus's first --pairs."""
    from keras_transformer.data.multi30k import find_multi30k_file

    paths = opts.corpus or [find_multi30k_file("train", lang) for lang in ("en", "de")]
    sides = [read_lines(path, opts.pairs) for path in paths]
    if opts.tokenizer:
        return tokenized_lengths(opts.tokenizer, sides)
    words = np.array([[len(s.split()), len(t.split())] for s, t in zip(*sides)])
    return np.rint(words * opts.pieces_per_word).astype(int) + 1  # + eos, + bos


def tokenized_lengths(run_dir: str, sides: list[list[str]]) -> np.ndarray:
    """(pairs, 2) lengths in pieces with the tokenizer of the run in `run_dir`, + eos / bos."""
    import tensorflow as tf

    from keras_transformer.run_dir import Run

    tokenizer = Run(run_dir).load_tokenizer()
    columns = []
    for side in sides:
        text = tf.constant([line.rstrip("\n") for line in side])
        columns.append(tokenizer.tokenize(text).row_lengths().numpy())
    return np.stack(columns, axis=1).astype(int) + 1


def length_source(opts) -> str:
    """How the pairs' lengths were counted (the row's "lengths")."""
    if opts.tokenizer:
        return f"tokenizer of {opts.tokenizer}"
    return f"estimated: words x {opts.pieces_per_word:g}"


def pipeline_batches(opts, vocab_size: int, budget: int, static_rows: int | None) -> list:
    """The batches of one pass, as numpy `((src, tgt_in), tgt_out)`, chunk by chunk."""
    import tensorflow as tf

    from keras_transformer.data.batching import _bucket, bucket_boundaries

    lengths = pair_lengths(opts)
    lengths = lengths[(lengths <= opts.max_length).all(axis=1)]
    rng = np.random.default_rng(0)
    boundaries = bucket_boundaries(opts.max_length)
    batches = []
    for start in range(0, len(lengths), opts.chunk_pairs):
        chunk = rng.permutation(lengths[start : start + opts.chunk_pairs])
        rows = [
            (rng.integers(4, vocab_size, n), rng.integers(4, vocab_size, m + 1)) for n, m in chunk
        ]

        def pairs(rows=rows):
            for src, tgt in rows:
                yield src.astype("int32"), tgt[:-1].astype("int32"), tgt[1:].astype("int32")

        spec = tf.TensorSpec([None], tf.int32)
        data = tf.data.Dataset.from_generator(pairs, output_signature=(spec, spec, spec))
        for src, tgt_in, tgt_out in _bucket(data, boundaries, budget, static_rows):
            batches.append(((src.numpy(), tgt_in.numpy()), tgt_out.numpy()))
    return batches


def shape_summary(batches: list) -> dict:
    """The distinct (rows, length) shapes of a pass and its batches."""
    shapes = sorted({b[0][0].shape for b in batches})
    return {"batches_per_pass": len(batches), "distinct_shapes": len(shapes)}
