"""Train a Transformer (default: small preset on Multi30k, en->de).

    python train.py --strategy mirrored
    python train.py --dataset tfds:wmt14_translate/de-en --src-lang en --tgt-lang de \
        --preset base --strategy mirrored --precision mixed_float16 --batch-tokens 25000

Running again with the same --model-dir resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    from keras_transformer.training.trainer import TrainArgs

    d = TrainArgs()
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--preset", default=d.preset, choices=["tiny", "small", "base", "big"])
    p.add_argument("--src-lang", default=d.src_lang)
    p.add_argument("--tgt-lang", default=d.tgt_lang)
    p.add_argument("--dataset", default=d.dataset, help="multi30k | files | tfds:NAME")
    p.add_argument("--train-src")
    p.add_argument("--train-tgt")
    p.add_argument("--valid-src")
    p.add_argument("--valid-tgt")
    p.add_argument(
        "--data-dir",
        default=os.environ.get("KT_DATA_DIR"),
        help="local data: Multi30k files or a TFDS data_dir (env KT_DATA_DIR)",
    )
    p.add_argument(
        "--model-dir",
        default=d.model_dir,
        help="checkpoints, tokenizer, config.json, logs, metrics.jsonl",
    )
    p.add_argument(
        "--strategy",
        default=d.strategy,
        choices=["default", "one_device", "mirrored", "multi_worker", "tpu"],
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=d.cpu_devices,
        help="split the CPU into N logical devices (multi-device paths without GPUs)",
    )
    p.add_argument(
        "--precision", default=d.precision, choices=["float32", "mixed_float16", "mixed_bfloat16"]
    )
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--spm-model-type", default=d.spm_model_type, choices=["bpe", "unigram"])
    p.add_argument(
        "--batch-tokens", type=int, default=d.batch_tokens, help="padded tokens per batch"
    )
    p.add_argument(
        "--accum-steps", type=int, default=d.accum_steps, help="micro-batches per update"
    )
    p.add_argument("--max-length", type=int, default=d.max_length)
    p.add_argument("--epochs", type=int)
    p.add_argument("--train-steps", type=int)
    p.add_argument(
        "--steps-per-epoch", type=int, default=d.steps_per_epoch, help="with --train-steps"
    )
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)
    p.add_argument(
        "--eval-every",
        type=int,
        default=d.eval_every,
        help="validation BLEU every N steps (0: at epoch ends only)",
    )
    p.add_argument(
        "--eval-sentences",
        type=int,
        default=d.eval_sentences,
        help="validation sentences for BLEU (0: all)",
    )
    p.add_argument("--eval-beam-size", type=int, default=d.eval_beam_size)
    p.add_argument(
        "--patience",
        type=int,
        default=d.patience,
        help="early stop after N BLEU evals without gain",
    )
    p.add_argument("--log-every", type=int, default=d.log_every)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument(
        "--lr-scale", type=float, default=d.lr_scale, help="multiplies the paper's schedule"
    )
    p.add_argument("--dropout-rate", type=float, help="override the preset's dropout")
    p.add_argument("--label-smoothing", type=float, help="override 0.1")
    p.add_argument("--jit-compile", action="store_true", help="XLA (measure first: slower on CPU)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--verbose", type=int, choices=[0, 1, 2], help="Keras fit verbosity")
    return TrainArgs(**{k: v for k, v in vars(p.parse_args(argv)).items()})


def main(argv=None) -> int:
    args = parse_args(argv)
    from keras_transformer.data import DataError, PipelineError
    from keras_transformer.run_dir import RunDirError
    from keras_transformer.training.callbacks import TrainingError
    from keras_transformer.training.strategy import StrategyError, split_cpu
    from keras_transformer.training.trainer import run

    try:
        split_cpu(args.cpu_devices)
        result = run(args)
    except (DataError, PipelineError, StrategyError, RunDirError, TrainingError) as err:
        print(f"train.py: error: {err}", file=sys.stderr)
        return 2
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
