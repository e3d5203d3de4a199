"""Decoding speed on real sentences, against CTranslate2 running the SAME weights.

    python benchmarks/bench_real.py --run RUN_DIR [--rounds 5]   # pip install -e ".[bench]"

Takes a training run, exports it with export.py (the product's own path, averaging the last
--average-last checkpoints), loads the same averaged weights, checks that they are the
export's, and writes them as a CTranslate2 model (benchmarks/reference.py). Then it
translates --source (default: test_2016_flickr.en.gz of Multi30k under --data-dir or
$KT_DATA_DIR) in batches of --batch sentences, strings in and strings out:
  - ours: the export's `serving_default` (the defaults: beam 4, alpha 0.6, +50) and
    `translate_with_options` (greedy: beam 1, alpha 0; beam 4 alpha 0 for the check only),
    in a process of its own;
  - CTranslate2 float32 and int8, each compute type in a process of its own, with the same
    options (max_decoding_length: the batch's longest source, eos included, + 50;
    min_decoding_length: ours), SentencePiece in Python on both sides of each batch.
It checks that the outputs agree (how many sentences differ, and why) and times the
decoders in interleaved rounds (each decoder once per round, in turn). Prints JSON:
sentences/s (median over the rounds), our speed relative to each CTranslate2 compute type
(the median of the per-round ratios, and their range), the CPU's ISA flags. `--env
NAME=VALUE` sets a variable in our export's process only (a server setting to compare with
the `--baseline` run without it, e.g. TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1). `--xla` exports
ours with `export.py --xla` (the search compiled by XLA, in segments); `--baseline .` then
times the default export of this same checkout beside it and counts the outputs that differ.
`--dtype bfloat16` (or float16) exports ours with `export.py --dtype` (the same float32
weights, computed in that precision): compare it with CTranslate2 int8.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from figures import add_record_flag, record  # noqa: E402
from reference import Worker, interleaved, isa_flags, ratios, write_ctranslate2  # noqa: E402

from keras_transformer import config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = "bench_real.py"
# the search settings compared; "default" is the export's serving_default
SETTINGS = {
    "default": dict(beam_size=4, alpha=0.6),
    "greedy": dict(beam_size=1, alpha=0.0),
    "beam4_alpha0": dict(beam_size=4, alpha=0.0),
}
TIMED = ("default", "greedy")
MAX_EXTRA_LENGTH = 50
# our translations' minimum length, tokens before eos (CTranslate2's min_decoding_length)
MIN_LENGTH = config.MIN_LENGTH


def fail(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def batched(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# -- the decoders, each built in its worker process ---------------------------------------


def savedmodel_decoders(export: str, batches: list[list[str]]) -> dict:
    """{setting: run}: our export, `serving_default` for "default" and
    `translate_with_options` for the others (its option inputs filled per its signature:
    scalars, or one value per sentence)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (registers the SentencePiece ops the export uses)

    loaded = tf.saved_model.load(export)
    default = loaded.signatures["serving_default"]
    options = loaded.signatures["translate_with_options"]
    specs = options.structured_input_signature[1]

    def with_options(batch, beam_size, alpha):
        values = dict(
            inputs=batch,
            beam_size=beam_size,
            alpha=alpha,
            max_extra_length=MAX_EXTRA_LENGTH,
            num_hypotheses=1,
            target_prefix="",
        )
        feed = {}
        for name, spec in specs.items():  # what this export's signature takes
            value = values[name]
            if name != "inputs" and spec.shape.rank:  # one value per sentence
                value = [value] * len(batch)
            feed[name] = tf.constant(value, spec.dtype)
        return options(**feed)["outputs"][:, 0]

    def run(setting):
        outputs = []
        for batch in batches:
            if setting == "default":
                text = default(inputs=tf.constant(batch))["outputs"]
            else:
                text = with_options(batch, **SETTINGS[setting])
            outputs += [t.decode("utf-8") for t in text.numpy()]
        return outputs

    return {setting: (lambda s=setting: run(s)) for setting in SETTINGS}


def ctranslate2_decoders(
    model_dir: str, compute_type: str, spm_model: str, batches: list[list[str]], max_tokens: int
) -> dict:
    """{setting: run}: CTranslate2 with `compute_type` on the same batches, SentencePiece
    encoding and decoding included, sources cut as ours (max_tokens - 1 pieces, then eos)."""
    import sentencepiece as spm
    from reference import ctranslate2_translator

    translator = ctranslate2_translator(model_dir, compute_type)
    sp = spm.SentencePieceProcessor(model_file=spm_model)

    def run(beam_size, alpha):
        outputs = []
        for batch in batches:
            pieces = [p[: max_tokens - 1] for p in sp.encode(batch, out_type=str)]
            results = translator.translate_batch(
                pieces,
                beam_size=beam_size,
                length_penalty=alpha,
                max_batch_size=len(batch),
                max_decoding_length=max(len(p) + 1 for p in pieces) + MAX_EXTRA_LENGTH,
                min_decoding_length=MIN_LENGTH,
            )
            outputs += sp.decode([r.hypotheses[0] for r in results])
        return outputs

    def score(sources, targets):
        """[(sum of the target's log-probs, eos included; its pieces, eos included)]."""
        src = [p[: max_tokens - 1] for p in sp.encode(sources, out_type=str)]
        results = translator.score_batch(src, sp.encode(targets, out_type=str))
        return [(float(sum(r.log_probs)), len(r.tokens)) for r in results]

    decoders = {setting: (lambda o=options: run(**o)) for setting, options in SETTINGS.items()}
    return {**decoders, "score": score}


# -- checks -------------------------------------------------------------------------------


def same_weights(model, export: str) -> None:
    """Raise unless the export's variables are `model`'s weights (compared as sets of
    (shape, sum, sum of magnitudes): the checkpoint names differ, and an export saves a
    variable under several names)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(os.path.join(export, "variables", "variables"))
    saved = [reader.get_tensor(n) for n in reader.get_variable_to_shape_map() if "ATTRIB" in n]

    def key(a):
        a = np.asarray(a, np.float64)
        return (a.shape, round(float(a.sum()), 4), round(float(np.abs(a).sum()), 4))

    ours = {key(w) for w in model.weights}
    theirs = {key(w) for w in saved if np.asarray(w).dtype.kind == "f"}
    if ours != theirs or len(ours) != len(model.weights):
        raise RuntimeError("the export's variables are not the loaded run's weights")


def gnmt(log_prob: float, length: int, alpha: float) -> float:
    return log_prob / ((5.0 + length) / 6.0) ** alpha


def agreement(sources, ours, theirs, setting: str, scorer, spm_model: str) -> dict:
    """How many outputs differ, and why: each differing pair is scored by CTranslate2
    float32 (`scorer`, a Worker) and ranked by our rule (GNMT penalty, eos counted): either
    our search found the better one by our rule ("ours ranks higher"), or CTranslate2's
    ("theirs ranks higher": a search difference), or a tie within 1e-4 (two kernels' sums
    of floats); outputs at our maximum length (source + 50 pieces, per sentence, where
    CTranslate2's limit is per batch) are counted apart."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    alpha = SETTINGS[setting]["alpha"]
    reasons = {"ours at its max length": 0, "ours ranks higher": 0, "theirs ranks higher": 0,
               "tie (within 1e-4)": 0}  # fmt: skip
    if differ:
        pick = [sources[i] for i in differ]
        mine = scorer.call("score", pick, [ours[i] for i in differ])
        other = scorer.call("score", pick, [theirs[i] for i in differ])
        for i, (lp_a, n_a), (lp_b, n_b) in zip(differ, mine, other, strict=True):
            if n_a >= len(sp.encode(sources[i])) + 1 + MAX_EXTRA_LENGTH:
                reasons["ours at its max length"] += 1
                continue
            a, b = gnmt(lp_a, n_a, alpha), gnmt(lp_b, n_b, alpha)
            key = "tie (within 1e-4)" if abs(a - b) <= 1e-4 else (
                "ours ranks higher" if a > b else "theirs ranks higher")  # fmt: skip
            reasons[key] += 1
    return {
        "sentences_differ": len(differ),
        "why": reasons,
        "differ_indices": differ[:20],
        "ours_empty_for_nonempty_source": sum(
            1 for s, o in zip(sources, ours, strict=True) if s.strip() and not o
        ),
        "ctranslate2_empty_for_nonempty_source": sum(
            1 for s, o in zip(sources, theirs, strict=True) if s.strip() and not o
        ),
    }


def baseline_changes(sources, ours, base) -> dict:
    """Which outputs differ from the baseline's, and whether the baseline's were empty."""
    differ = [i for i, (a, b) in enumerate(zip(ours, base, strict=True)) if a != b]
    return {
        "sentences_differ": len(differ),
        "of_which_baseline_empty": sum(1 for i in differ if not base[i]),
        "examples": [
            {"source": sources[i], "ours": ours[i], "baseline": base[i]} for i in differ[:5]
        ],
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, help="a training run (train.py --model-dir)")
    parser.add_argument("--source", help="sentences, one a line (.gz read as gzip)")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("KT_DATA_DIR"),
        help="holds multi30k/ (--source default)",
    )
    parser.add_argument("--limit", type=int, default=0, help="first N sentences only (0: all)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of interleaved runs")
    parser.add_argument("--average-last", type=int, default=5, help="as export.py's")
    parser.add_argument("--no-int8", action="store_true", help="skip CTranslate2 int8")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable set in our export's process only (not the baseline's "
        "nor CTranslate2's), e.g. TF_ONEDNN_ASSUME_FROZEN_WEIGHTS=1; repeatable",
    )
    parser.add_argument(
        "--xla",
        action="store_true",
        help="ours exported with export.py --xla (the search compiled by XLA; its shapes "
        "compile in the untimed first pass); with --baseline, the default export of the "
        "baseline checkout (e.g. this one) is timed and compared beside it",
    )
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="ours exported with export.py --dtype (compute precision; the weights stay "
        "float32); the baseline, if any, stays float32",
    )
    parser.add_argument(
        "--baseline",
        help="a checkout of another version of the code (e.g. git worktree add ../base main): "
        "its export of the same run is timed beside ours and its outputs compared with ours",
    )
    add_record_flag(parser)
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.run, "config.json")):
        fail(f"--run {args.run}: not a training run (no config.json); give train.py's --model-dir")
    if args.source is None:
        if not args.data_dir:
            fail("--source is required unless --data-dir (or KT_DATA_DIR) holds multi30k/")
        args.source = os.path.join(args.data_dir, "multi30k", "test_2016_flickr.en.gz")
    if not os.path.isfile(args.source):
        fail(f"--source {args.source}: no such file")
    for flag in ("batch", "rounds", "average_last"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.baseline and not os.path.isfile(os.path.join(args.baseline, "export.py")):
        fail(f"--baseline {args.baseline}: not a checkout of this project (no export.py)")
    if args.limit < 0:
        fail(f"--limit must be >= 0, got {args.limit}")
    for item in args.env:
        if not item.partition("=")[0] or "=" not in item:
            fail(f"--env {item}: expected NAME=VALUE")
    return args


@contextlib.contextmanager
def environment(items: list[str]):
    """os.environ with NAME=VALUE `items` set, restored after (spawned workers inherit it)."""
    saved = dict(os.environ)
    os.environ.update(item.split("=", 1) for item in items)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def export_run(args, code: str, export_dir: str, xla: bool = False, dtype="float32") -> str:
    """Export --run with the export.py of the checkout `code` (its package imported), with
    `--xla` if `xla` and `--dtype` unless float32; returns the version directory."""
    subprocess.run(
        [sys.executable, os.path.join(code, "export.py"), "--model-dir", args.run,
         "--export-dir", export_dir, "--average-last", str(args.average_last),
         *(["--xla"] if xla else []), *(["--dtype", dtype] if dtype != "float32" else [])],
        check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": code},
    )  # fmt: skip
    return os.path.join(export_dir, "transformer", "1")


def prepare(args, tmp: str) -> tuple[str, str, str, int]:
    """Export the run, write the CTranslate2 model of the same weights and the SentencePiece
    model into `tmp`: (export, CTranslate2 model dir, spm model, max source tokens)."""
    import sentencepiece as spm

    from keras_transformer.run_dir import load_trained

    export = export_run(args, ROOT, os.path.join(tmp, "export"), xla=args.xla, dtype=args.dtype)
    model, tokenizer, _ = load_trained(args.run, average_last=args.average_last)
    same_weights(model, export)
    spm_model = os.path.join(tmp, "spm.model")
    with open(spm_model, "wb") as handle:
        handle.write(tokenizer.proto)
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    tokens = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    max_tokens = model.config.max_length
    reference = os.path.join(tmp, "ctranslate2")
    write_ctranslate2(model, tokens, reference, max_positions=max_tokens + MAX_EXTRA_LENGTH + 8)
    return export, reference, spm_model, max_tokens


def measure(args, sources, tmp: str) -> tuple[dict, dict]:
    """(agreement, {decoder: [seconds per round]}), every decoder in its own process."""
    export, reference, spm_model, max_tokens = prepare(args, tmp)
    batches = batched(sources, args.batch)
    with environment(args.env):
        workers = {"ours": Worker(savedmodel_decoders, export=export, batches=batches)}
    if args.baseline:
        base = export_run(args, os.path.abspath(args.baseline), os.path.join(tmp, "baseline"))
        workers["baseline"] = Worker(savedmodel_decoders, export=base, batches=batches)
    for compute_type in ("float32",) + (() if args.no_int8 else ("int8",)):
        workers[f"ctranslate2_{compute_type}"] = Worker(
            ctranslate2_decoders,
            model_dir=reference,
            compute_type=compute_type,
            spm_model=spm_model,
            batches=batches,
            max_tokens=max_tokens,
        )
    try:
        outputs = {
            (who, setting): worker.outputs(setting)  # also the warm-up
            for who, worker in workers.items()
            for setting in SETTINGS
        }
        check = {
            f"{setting}_{who}": agreement(
                sources,
                outputs[("ours", setting)],
                outputs[(who, setting)],
                setting,
                workers["ctranslate2_float32"],
                spm_model,
            )
            for setting in SETTINGS
            for who in workers
            if who.startswith("ctranslate2")
        }
        if args.baseline:
            check["ours_vs_baseline"] = {
                setting: baseline_changes(
                    sources, outputs[("ours", setting)], outputs[("baseline", setting)]
                )
                for setting in SETTINGS
            }
        times = interleaved(
            {f"{who}_{s}": (w, s) for s in TIMED for who, w in workers.items()}, args.rounds
        )
    finally:
        for worker in workers.values():
            worker.close()
    return check, times


def main(argv=None) -> None:
    args = parse_args(argv)
    try:
        import ctranslate2
    except ImportError:
        fail("CTranslate2 is not installed: pip install -e '.[bench]'")
    sources = read_lines(args.source)[: args.limit or None]
    if not sources:
        fail(f"--source {args.source}: no sentences")

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        check, times = measure(args, sources, tmp)
    competitors = [name[: -len("_default")] for name in times if name.endswith("_default")]
    report = {
        "benchmark": "real sentences, same weights (benchmarks/bench_real.py)",
        "command": "python " + " ".join([os.path.relpath(__file__, ROOT), *(argv or sys.argv[1:])]),
        "source": os.path.basename(args.source),
        "sentences": len(sources),
        "batch": args.batch,
        "rounds": args.rounds,
        "settings": {
            s: {**SETTINGS[s], "max_extra_length": MAX_EXTRA_LENGTH, "min_length": MIN_LENGTH}
            for s in SETTINGS
        },
        "machine": f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}",
        "isa_flags": isa_flags(),
        "tensorflow": tf.__version__,
        "ours_env": args.env,
        "ours_xla": args.xla,
        "ours_dtype": args.dtype,
        "ctranslate2": ctranslate2.__version__,
        "agreement_with_ctranslate2": check,
        "sentences_per_s": {
            name: round(len(sources) / float(np.median(runs)), 1) for name, runs in times.items()
        },
        "ours_vs": {
            f"{who}_{s}": ratios(times, f"ours_{s}", f"{who}_{s}")
            for s in TIMED
            for who in competitors
            if who != "ours"
        },
    }
    print(json.dumps(report, indent=2, ensure_ascii=False))
    record(args.record, report)


if __name__ == "__main__":
    main()
