"""WMT-scale rehearsal: train.py on a 4.5M-pair local TFDS dataset, with automatic settings.

    KT_DATA_DIR=../shared/data python benchmarks/bench_wmt_rehearsal.py  (alone on the machine)

Builds once, and keeps in --cache-dir, a TFDS dataset `kt_rehearsal` of --pairs pairs (the
size of WMT14 en-de): Multi30k's training pairs repeated, every line ending with a unique
marker " [n]" so that no two pairs are equal. Then:

- runs `train.py --dataset tfds:kt_rehearsal --data-dir CACHE --preset base` with every
  training setting automatic (only --log-every 1, to see the first update, and the
  evaluation size), stops it after its first optimizer update, and reports the resolved
  settings (config.json), the seconds from start to that update and train.py's peak RSS;
- starts it again in the same run directory (config.json and spm.model there: no tokenizer
  training) up to the end of its first update, moves that checkpoint's data position to the
  middle of a chunk in the middle of the first pass, and resumes from it: the seconds from
  start to the first update of each (the resume's target: within 10% of the fresh start's);
- measures the training input pipeline (`training_batches` with the run's tokenizer and
  tokens per update, --batch-tokens x --accum-steps) in its own process, on the full
  dataset and on one 10x smaller: pairs/s and peak RSS, which must stay flat with the
  corpus size.

JSON on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from figures import add_record_flag, record

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "kt_rehearsal"


def rehearsal_builder():
    """The TFDS builder class (registered once, on first use)."""
    import tensorflow_datasets as tfds

    class KtRehearsal(tfds.core.GeneratorBasedBuilder):
        """Multi30k's pairs repeated to `PAIRS` pairs, each line with a unique marker."""

        VERSION = tfds.core.Version("1.0.0")
        PAIRS, LINES = 0, {}

        def _info(self):
            text = tfds.features.Text()
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict({"en": text, "de": text}),
                disable_shuffling=True,  # written in order: no on-disk shuffle of 4.5M pairs
            )

        def _split_generators(self, dl_manager):
            return {
                "train": self._generate_examples(self.PAIRS, 0),
                "validation": self._generate_examples(500, 1),
            }

        def _generate_examples(self, count, offset):
            en, de = self.LINES["en"], self.LINES["de"]
            for i in range(count):
                j = (i + offset) % len(en)
                yield i, {"en": f"{en[j]} [{i}]", "de": f"{de[j]} [{i}]"}

    return KtRehearsal


def build(cache_dir: str, multi30k_dir: str, pairs: int) -> tuple[str, float]:
    """(TFDS data dir holding kt_rehearsal with `pairs` pairs, seconds spent building it)."""
    global BUILDER
    BUILDER = BUILDER or rehearsal_builder()
    data_dir = os.path.join(cache_dir, f"pairs-{pairs}")
    BUILDER.LINES = {}
    for lang in ("en", "de"):
        with gzip.open(os.path.join(multi30k_dir, f"train.{lang}.gz"), "rt", encoding="utf-8") as f:
            BUILDER.LINES[lang] = [line.strip() for line in f]
    BUILDER.PAIRS = pairs
    builder = BUILDER(data_dir=data_dir)
    start = time.perf_counter()
    if not builder.is_prepared():
        builder.download_and_prepare()
    return data_dir, round(time.perf_counter() - start, 1)


BUILDER = None


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def train_command(data_dir: str, model_dir: str) -> list[str]:
    return [
        sys.executable, os.path.join(ROOT, "train.py"), "--dataset", f"tfds:{NAME}",
        "--data-dir", data_dir, "--preset", "base", "--model-dir", model_dir,
        "--log-every", "1", "--eval-sentences", "50", "--verbose", "2",
    ]  # fmt: skip


def rehearse(data_dir: str, model_dir: str) -> dict:
    """train.py until its first update: resolved settings, seconds, peak RSS."""
    cmd = train_command(data_dir, model_dir)
    metrics = os.path.join(model_dir, "metrics.jsonl")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, first_update = 0.0, None
    try:
        while proc.poll() is None:
            peak = max(peak, peak_rss_mb(proc.pid))
            if os.path.isfile(metrics) and os.path.getsize(metrics):
                first_update = round(time.perf_counter() - start, 1)
                break
            time.sleep(0.5)
    finally:
        proc.kill()
        output = proc.communicate()[0]
    if first_update is None:
        raise SystemExit(f"train.py ended before its first update:\n{output[-3000:]}")
    settings = json.load(open(os.path.join(model_dir, "config.json")))["training"]
    return {
        "command": " ".join(cmd[1:]),
        "settings": settings,
        "seconds_to_first_update": first_update,
        "train_py_peak_rss_mb": peak,
    }


def updated_to(metrics: str, step: int) -> bool:
    """Whether metrics.jsonl has a record of update `step` (or later)."""
    if not os.path.isfile(metrics):
        return False
    with open(metrics) as handle:
        for line in handle:
            try:
                if json.loads(line).get("step", 0) >= step:
                    return True
            except ValueError:  # a line being written
                continue
    return False


def seconds_to_update(cmd: list[str], model_dir: str, step: int, stop: bool = True) -> float:
    """Seconds from the start of `cmd` to the metrics record of update `step`; then the
    process is killed (`stop`) or waited for (it must then end with status 0)."""
    metrics = os.path.join(model_dir, "metrics.jsonl")
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = None
    try:
        while proc.poll() is None:
            if seconds is None and updated_to(metrics, step):
                seconds = round(time.perf_counter() - start, 1)
                if stop:
                    break
            time.sleep(0.2)
    finally:
        if stop:
            proc.kill()
        output = proc.communicate()[0]
    if seconds is None and updated_to(metrics, step):  # the process ended between two looks
        seconds = round(time.perf_counter() - start, 1)
    if seconds is None or (not stop and proc.returncode):
        raise SystemExit(f"train.py did not reach update {step}:\n{output[-3000:]}")
    return seconds


def move_checkpoint(prefix: str, position: int, batches: int) -> None:
    """Rewrite checkpoint `prefix` with its data stream at stream position `position` and
    `batches` batches consumed (everything else as saved)."""
    import numpy as np
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    new = {"data_next": position, "data_position": batches}
    names, tensors = sorted(dtypes), []
    for name in names:
        key = name.split("/", 1)[0]
        if key in new and name.endswith("VARIABLE_VALUE"):
            tensors.append(tf.constant(np.asarray(new[key], dtype=dtypes[name].as_numpy_dtype)))
        else:
            tensors.append(tf.constant(reader.get_tensor(name), dtype=dtypes[name]))
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )


def resume_vs_fresh(cmd: list[str], model_dir: str, pairs: int) -> dict:
    """Seconds to the first update of a fresh start in `model_dir` (its config.json and
    spm.model already there: no tokenizer training; run to the end of update 1, which saves
    a checkpoint) and of a resume from that checkpoint moved to the middle of a chunk in the
    middle of the first pass (what a preemption at a random moment costs)."""
    from keras_transformer.data.pipeline import chunk_size, stream_position
    from keras_transformer.run_dir import Run

    for name in ("metrics.jsonl", "logs", "checkpoints"):  # what the first start left
        path = os.path.join(model_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.isfile(path):
            os.remove(path)
    fresh = seconds_to_update([*cmd, "--train-steps", "1"], model_dir, 1, stop=False)
    settings = json.load(open(os.path.join(model_dir, "config.json")))["training"]
    chunks = -(-pairs // chunk_size(pairs))
    in_chunk = max(1, settings["steps_per_epoch"] // chunks) // 2
    position = stream_position(0, in_chunk, chunk=chunks // 2)
    move_checkpoint(Run(model_dir).checkpoints()[-1], position, settings["steps_per_epoch"] // 2)
    resumed = seconds_to_update([*cmd, "--train-steps", "2"], model_dir, 2)
    return {
        "fresh_start_s": fresh,
        "resume_mid_pass_s": resumed,
        "resumed_at": {"pass": 0, "chunk": chunks // 2, "batch_in_chunk": in_chunk},
        "resume_over_fresh": round(resumed / fresh, 3),
    }


def pipeline(data_dir: str, spm_model: str, batch_tokens: int, max_length: int, batches: int):
    """In a child process: the training stream's pairs/s and the process's peak RSS."""
    from keras_transformer.data import SubwordTokenizer, load_parallel, training_batches

    corpus = load_parallel(f"tfds:{NAME}", "train", "en", "de", data_dir=data_dir)
    data = training_batches(
        corpus,
        SubwordTokenizer(spm_model),
        batch_tokens=batch_tokens,
        max_length=max_length,
        seed=0,
    )
    iterator = iter(data)
    for _ in range(10):  # warm-up: fill the shuffle buffer
        next(iterator)
    rows, start = 0, time.perf_counter()
    for _ in range(batches):
        (source, _), _ = next(iterator)
        rows += int(source.shape[0])
    return {
        "pairs": corpus.num_pairs,
        "pairs_per_batch": round(rows / batches, 1),
        "pairs_per_s": round(rows / (time.perf_counter() - start), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", default=os.environ.get("KT_DATA_DIR"), help="Multi30k")
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument(
        "--cache-dir",
        default=os.path.join(os.path.expanduser("~/.cache"), "keras_transformer", "rehearsal"),
        help="where the TFDS datasets are built once and kept",
    )
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument(
        "--build-only", action="store_true", help="build and cache the datasets, measure nothing"
    )
    parser.add_argument(
        "--no-resume",
        action="store_true",
        help="skip the resume figures (a fresh start and a resume mid-pass, to the first update)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    add_record_flag(parser)
    args = parser.parse_args(argv)
    if args.child:
        data_dir, spm_model, batch_tokens, max_length = args.child
        print(
            json.dumps(
                pipeline(data_dir, spm_model, int(batch_tokens), int(max_length), args.batches)
            )
        )
        return

    from keras_transformer.data.sources import find_multi30k_file

    multi30k = os.path.dirname(find_multi30k_file("train", "en", args.data_dir))
    report = {"machine": f"{os.cpu_count()} CPU cores"}
    small_dir, report["build_small_s"] = build(args.cache_dir, multi30k, args.pairs // 10)
    big_dir, report["build_s"] = build(args.cache_dir, multi30k, args.pairs)
    if args.build_only:
        print(json.dumps(report, indent=2))
        return
    model_dir = tempfile.mkdtemp(prefix="kt-rehearsal-")
    try:
        report["train_py"] = rehearse(big_dir, model_dir)
        if not args.no_resume:
            cmd = train_command(big_dir, model_dir)
            report["resume"] = resume_vs_fresh(cmd, model_dir, args.pairs)
        settings = report["train_py"]["settings"]
        # the training stream's batches are whole updates (split into micro-batches later)
        update_tokens = settings["batch_tokens"] * (settings.get("accum_steps") or 1)
        for key, data_dir in (("pipeline_small", small_dir), ("pipeline", big_dir)):
            cmd = [sys.executable, __file__, "--batches", str(args.batches), "--child", data_dir,
                   os.path.join(model_dir, "spm.model"), str(update_tokens),
                   str(settings["max_length"])]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            report[key] = json.loads(out.strip().splitlines()[-1])
        report["pairs_over_pairs_per_batch"] = round(
            report["pipeline"]["pairs"] / report["pipeline"]["pairs_per_batch"]
        )  # what settings["steps_per_epoch"] should be close to
        report["rss_ratio_full_vs_tenth"] = round(
            report["pipeline"]["peak_rss_mb"] / report["pipeline_small"]["peak_rss_mb"], 2
        )
        print(json.dumps(report, indent=2))
        record(args.record, report)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
