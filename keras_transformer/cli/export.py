"""Export a training run as a SavedModel for TensorFlow Serving.

kt-export --model-dir runs/en-de --export-dir exports --model-name transformer

Averages the last 5 checkpoints by default (the paper's practice; `--average-last 1` turns
it off; a run trained with --ema-decay contributes its moving averages unless --no-ema),
adds or replaces this model's entry in <export-dir>/models.config (other models' entries
are kept) and prints what it wrote: paths, signatures with their inputs and outputs, size
on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from keras_transformer.cli.common import (
    ArgumentParser,
    add_log_level_flag,
    flag_error,
    import_tensorflow,
    setup_logging,
    version_text,
)

# the library's defaults; keras_transformer.config imports no TensorFlow, so --help is quick
from keras_transformer.config import (  # noqa: E402
    ALPHA,
    AVERAGE_LAST,
    BEAM_SIZE,
    FINISH_RULE,
    FINISH_RULES,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
    STOP_RULE,
    STOP_RULES,
)

# spec.optimize's quantizations (CTranslate2 4.x; ctranslate2_export.QUANTIZATIONS)
QUANTIZATIONS = (
    "float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
    "bfloat16",
)  # fmt: skip


class VersionOrNumber(argparse.Action):
    """`--version N` numbers the export (TF Serving's version directory, the flag's meaning
    since 0.1.0); `--version` alone prints the program's version, as every command does."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            print(version_text(parser.prog))
            parser.exit(0)
        setattr(namespace, self.dest, values)


def parse_args(argv=None, prog: str = "kt-export") -> argparse.Namespace:
    parser = ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _add_run_flags(parser.add_argument_group("the run and where its export goes"))
    _add_search_flags(parser.add_argument_group("the exported search's defaults"))
    _add_format_flags(parser.add_argument_group("what is written"))
    add_log_level_flag(parser)
    return parser.parse_args(argv)


def _add_run_flags(group) -> None:
    group.add_argument(
        "--model-dir", required=True, help="the training run (config.json, spm.model, checkpoints/)"
    )
    group.add_argument(
        "--export-dir", required=True, help="writes <export-dir>/<model-name>/<version>/"
    )
    group.add_argument("--model-name", default="transformer")
    group.add_argument(
        "--version",
        type=int,
        nargs="?",
        action=VersionOrNumber,
        default=None,
        help="the export's version number (default: the next free one); without a number: "
        "print kt-export's version and exit",
    )
    group.add_argument(
        "--average-last",
        type=int,
        default=AVERAGE_LAST,
        help="average the last K checkpoints (default 5; 1: the last one only)",
    )
    group.add_argument(
        "--best", action="store_true", help="export the best-BLEU checkpoint instead"
    )
    group.add_argument(
        "--no-ema",
        action="store_true",
        help="a run trained with --ema-decay: export the raw weights, not their moving average",
    )


def _add_search_flags(group) -> None:
    group.add_argument("--beam-size", type=int, default=BEAM_SIZE)
    group.add_argument("--alpha", type=float, default=ALPHA, help="length penalty exponent")
    group.add_argument(
        "--max-extra-length",
        type=int,
        default=MAX_EXTRA_LENGTH,
        help="output may exceed input by this",
    )
    group.add_argument(
        "--min-length",
        type=int,
        default=MIN_LENGTH,
        help=f"shortest translation of a non-empty input, in tokens before eos (default "
        f"{MIN_LENGTH}: never an empty one; 0: no minimum, the paper's search)",
    )
    group.add_argument(
        "--stop-rule",
        choices=STOP_RULES,
        default=STOP_RULE,
        help="when beam search settles a sentence (default exact: the n best are those of the "
        "exhaustive search; finished: once beam-size hypotheses ended among the top beam-size "
        "candidates, CTranslate2's rule with a length penalty; top: once the best candidate "
        "ended, CTranslate2's rule without one; both faster, may change some outputs); the "
        'default of translate_with_stop_rule\'s per-sentence stop_rule ("")',
    )
    group.add_argument(
        "--finish-rule",
        choices=FINISH_RULES,
        default=FINISH_RULE,
        help="which candidates finish a hypothesis and how it is scored (default "
        "tensor2tensor: every eos among the 2 x beam-size best, GNMT length penalty; "
        "ctranslate2: CTranslate2's beam search, for its translations with --stop-rule top at "
        "--alpha 0, finished otherwise; see docs/inference.md); stored in assets/decoding.json",
    )
    group.add_argument(
        "--attention-layer",
        type=int,
        help="the decoder layer whose cross-attention `score` returns (default: the penultimate)",
    )


def _add_format_flags(group) -> None:
    group.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="compute dtype of the exported model (variables, logits and scores stay float32)",
    )
    group.add_argument(
        "--format",
        choices=("savedmodel", "ctranslate2"),
        default="savedmodel",
        help="savedmodel (TF Serving) or ctranslate2 (a CTranslate2 model directory; needs "
        'pip install -e ".[ctranslate2]"; models.config is left as it is)',
    )
    group.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="--format ctranslate2: the weights' type (default float32)",
    )
    group.add_argument(
        "--agreement-sentences",
        type=int,
        default=200,
        help="compare the export with the float32 exact-rule search on this many validation "
        "sentences of the run's dataset, in <version>/assets.extra/agreement.json (0: skip)",
    )
    group.add_argument(
        "--xla",
        action="store_true",
        help="beam searches compiled by XLA, in segments: the same outputs, faster; the "
        "server must enable XLA (TF Serving: --xla_cpu_compilation_enabled=true, on a GPU "
        "--xla_gpu_compilation_enabled=true) and --enable_model_warmup (the warmup "
        "requests compile every shape); SavedModel only; default: a graph any TF Serving runs",
    )
    group.add_argument(
        "--xla-max-batch",
        type=int,
        default=64,
        help="with --xla: the largest request, in sentences, the warmup compiles for "
        "(default 64, serving/batching.config's max_batch_size); larger ones compile on "
        "first use",
    )


def main(argv=None, prog: str = "kt-export") -> int:
    args = parse_args(argv, prog)
    setup_logging(args.log_level)
    import_tensorflow(args.log_level)
    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.inference.export import export_run

    try:
        check_flags(args)
        path = export_run(
            args.model_dir,
            args.export_dir,
            model_name=args.model_name,
            version=args.version,
            beam_size=args.beam_size,
            alpha=args.alpha,
            max_extra_length=args.max_extra_length,
            min_length=args.min_length,
            average_last=args.average_last,
            use_best=args.best,
            attention_layer=args.attention_layer,
            ema=not args.no_ema,
            stop_rule=args.stop_rule,
            finish_rule=args.finish_rule,
            dtype=args.dtype,
            export_format=args.format,
            quantization=args.quantization or "float32",
            agreement_sentences=args.agreement_sentences,
            xla=args.xla,
            xla_max_batch=args.xla_max_batch,
        )
    except KerasTransformerError as err:
        return flag_error(prog, err)
    except json.JSONDecodeError as err:
        config = os.path.join(args.model_dir, "config.json")
        return flag_error(prog, f"{config} is not valid JSON ({err}); restore it or retrain")
    except OSError as err:  # an export dir that cannot be written, a file that cannot be read
        return flag_error(
            prog, f"{err.filename}: {err.strerror}; check the path and its permissions"
        )
    print_written(args, path)
    return 0


def check_flags(args) -> None:
    """Raise `KerasTransformerError` naming the first flag whose value cannot work."""
    from keras_transformer.errors import KerasTransformerError
    from keras_transformer.files import check_writable_dir
    from keras_transformer.inference.export import check_search_format
    from keras_transformer.inference.options import check_min_length, check_options

    check_writable_dir(args.export_dir, "--export-dir")
    check_options(args.beam_size, args.alpha, args.max_extra_length)
    check_min_length(args.min_length)
    if args.version is not None and args.version < 1:
        raise KerasTransformerError(f"--version must be >= 1, got {args.version}")
    if args.xla_max_batch < 1:
        raise KerasTransformerError(f"--xla-max-batch must be >= 1, got {args.xla_max_batch}")
    check_search_format(args.xla, args.format)
    if args.average_last < 1:
        raise KerasTransformerError(f"--average-last must be >= 1, got {args.average_last}")
    if args.agreement_sentences < 0:
        raise KerasTransformerError(
            f"--agreement-sentences must be >= 0 (0: skip), got {args.agreement_sentences}"
        )
    check_format(args)


def print_written(args, path: str) -> None:
    """What the export wrote: its files (CTranslate2) or its signatures, and the agreement."""
    from keras_transformer.inference.export import describe_export

    if args.format == "ctranslate2":
        print(f"{path}: CTranslate2 model ({args.quantization or 'float32'})")
        for name in sorted(os.listdir(path)):
            print(f"  {os.path.join(path, name)}")
    else:
        print(describe_export(path))
        print(f"  {os.path.join(args.export_dir, 'models.config')} (model {args.model_name!r})")
    print(weights_line(args))
    print(agreement_line(path))


def weights_line(args) -> str:
    """Which checkpoints the export's weights come from (as `Run.load_model` chose them)."""
    from keras_transformer.run_dir import Run, has_averages

    paths = Run(args.model_dir).checkpoints(best=args.best)
    if args.best:
        return f"  weights: {paths[-1]} (best/: the best validation BLEU)"
    used = paths[-args.average_last :]
    steps = ", ".join(path.rsplit("-", 1)[-1] for path in used)
    what = f"the mean of {len(used)} checkpoints" if len(used) > 1 else "1 checkpoint"
    line = f"  weights: {what} (step {steps}) of {os.path.dirname(used[-1])}"
    if not args.no_ema and any(has_averages(path) for path in used):
        line += ", their moving averages (--ema-decay)"
    if len(used) < args.average_last:
        line += f"; --average-last {args.average_last} asked for more: the run has {len(used)}"
    return line


def check_format(args) -> None:
    """The flags of --format that do not fit together, before any work."""
    from keras_transformer.errors import KerasTransformerError

    if args.format != "ctranslate2":
        if args.quantization is not None:
            raise KerasTransformerError(
                "--quantization applies to --format ctranslate2 only; use --dtype for a SavedModel"
            )
        return
    if args.dtype != "float32":
        raise KerasTransformerError(
            "--dtype applies to --format savedmodel; use --quantization with --format ctranslate2"
        )
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise KerasTransformerError(
            '--format ctranslate2 needs the ctranslate2 package: pip install -e ".[ctranslate2]"'
        ) from None


def agreement_line(path: str) -> str:
    """One line on the agreement report of the export at `path`."""
    report_path = os.path.join(path, "assets.extra", "agreement.json")
    with open(report_path, encoding="utf-8") as handle:
        report = json.load(handle)
    if not report.get("sentences"):
        return f"  {report_path}: no comparison ({report.get('skipped')})"
    return (
        f"  {report_path}: {report['identical']} of {report['sentences']} outputs identical "
        f"to the float32 exact-rule search's, BLEU {report['bleu']['delta']:+.2f}, "
        f"chrF {report['chrf']['delta']:+.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
