"""benchmarks/bench_gpu.py runs as it is (here on 2 logical CPUs, tiny settings): one
command, one JSON with the environment, every configuration's row with its repeats and
spread, kt-train's operating point (strong scaling, one process or a job of local workers),
the memory sweep and, for a failed or hung child, an error
row with its stderr tail instead of a traceback or a hang."""

import json
import os
import subprocess
import sys

import pytest

from keras_transformer.settings.memory import step_bytes_per_token

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_gpu  # noqa: E402

TINY = [
    "--preset", "tiny", "--num-layers", "1", "--vocab-size", "64",
    "--precision", "mixed_bfloat16", "--cpu-devices", "2", "--steps", "2", "--warmup", "1",
]  # fmt: skip


def bench(*args, timeout=600):
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_gpu.py"), *TINY, *args]
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout
    )
    return out.returncode, json.loads(out.stdout), out.stderr


def test_the_defaults_are_kt_trains_operating_point_with_a_bfloat16_row_and_three_repeats():
    opts = bench_gpu.parse([])
    assert opts.mode == ["kt-train"] and opts.devices == ["1", "all"]
    assert opts.precision == ["mixed_float16", "mixed_bfloat16"]
    assert opts.repeats == 3 and opts.timeout > 0


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu_and_reports_every_configuration():
    code, report, err = bench(
        "--mode", "kt-train", "--devices", "1", "--workers", "2", "--repeats", "3", "--accum-steps", "2",
        "--batch-tokens", "512", "--pairs", "200", "--chunk-pairs", "80", "--max-length", "32",
        "--decode-sentences", "4", "--decode-length", "5",
    )  # fmt: skip
    assert code == 0, err[-3000:]
    env = report["environment"]
    assert env["tensorflow"].startswith("2.") and env["gpus"] == []
    assert env["cuda_build"] and env["cudnn_build"]  # what the wheel was built with
    assert env["nvidia_driver"] is None and env["cpu_count"] >= 1  # no GPU here
    assert report["devices_available"] == 2
    train = [r for r in report["results"] if r["kind"] == "train"]
    assert [(r["strategy"], r["devices"], r["workers"]) for r in train] == [
        ("mirrored", 1, 1), ("multi_worker", 2, 2)  # 2 local processes (TF_CONFIG), 1 CPU each
    ]  # fmt: skip
    for row in train:
        assert "error" not in row, row
        assert row["device_type"] == "CPU" and row["peak_device_memory_mib"] is None
        assert row["num_layers"] == 1  # --num-layers: the tiny preset's 2 layers cut to 1
        assert row["precision"] == "mixed_bfloat16" and row["peak_rss_mib"] > 0
        rate = row["target_tokens_per_s"]
        assert len(rate["repeats"]) == 3 and row["steps_timed"] == 6
        assert rate["min"] <= rate["median"] <= rate["max"] and rate["min"] > 0
        assert row["optimizer_steps"] == row["warmup_steps"] + 6
        assert row["traces"] == 1 and row["xla_traces"] == row["xla_compilations"] == 0
    point1, point2 = train
    # strong scaling: the update stays kt-train's, each replica's (each worker's) share halves
    assert point1["update_tokens"] == point2["update_tokens"] == 512 * 2
    assert point1["accum_steps"] == point2["accum_steps"] == 2
    assert (point1["tokens_per_replica"], point2["tokens_per_replica"]) == (512, 256)
    assert point1["scaling"] == "strong" and point1["efficiency"] == 1.0
    ratio = point2["target_tokens_per_s"]["median"] / (2 * point1["target_tokens_per_s"]["median"])
    assert point2["efficiency"] == pytest.approx(ratio, abs=1e-3)
    # the pipeline's shapes: several buckets and chunk ends, one pass as warmup
    assert point1["distinct_shapes"] > 1 and point1["warmup_steps"] == point1["batches_per_pass"]
    (decode,) = [r for r in report["results"] if r["kind"] == "decode"]
    assert decode["sentences"] == 4 and len(decode["sentences_per_s"]["repeats"]) == 3
    assert decode["num_layers"] == 1


@pytest.mark.slow
def test_fixed_mode_the_memory_sweep_and_a_failed_child_with_its_stderr_tail():
    code, report, _ = bench(
        "--mode", "fixed", "--devices", "2", "3", "--xla", "on", "--rows", "4", "--length", "6",
        "--repeats", "3", "--decode-sentences", "0",
        "--sweep-memory", "--max-length", "32", "--sweep-max-tokens", "256",
    )  # fmt: skip
    assert code == 1  # a row failed: the JSON is printed all the same
    fixed, row, sweep = report["results"]
    # weak scaling: one random batch of --rows rows per replica (no 1-device row: no efficiency)
    assert fixed["devices"] == 2 and fixed["global_rows"] == 4 * 2 and "error" not in fixed
    assert fixed["scaling"] == "weak" and fixed["efficiency"] is None
    assert fixed["strategy"] == "mirrored"
    assert len(fixed["target_tokens_per_s"]["repeats"]) == 3 and fixed["traces"] == 1
    # XLA's own count (its dumped modules): one shape, compiled once on each of the 2 devices
    assert fixed["xla"] and (fixed["xla_traces"], fixed["xla_compilations"]) == (1, 2)
    # the sweep: rows doubling to the cap, each point against settings.memory's model
    per_token = step_bytes_per_token("tiny", 64, 32, "mixed_bfloat16", num_layers=1)
    assert per_token < step_bytes_per_token("tiny", 64, 32, "mixed_bfloat16")  # 1 layer of 2
    assert sweep["kind"] == "memory" and sweep["predicted_bytes_per_token"] == per_token
    assert fixed["num_layers"] == sweep["num_layers"] == 1
    assert [p["tokens"] for p in sweep["points"]] == [32, 64, 128, 256]
    for point in sweep["points"]:
        assert point["predicted_mib"] == round(per_token * point["tokens"] / 2**20, 1)
        assert point["peak_mib"] >= 0
    assert sweep["points"][0]["ratio"] is None and sweep["points"][-1]["ratio"] is not None
    assert sweep["device_type"] == "CPU" and "RSS" in sweep["measured"]
    assert sweep["out_of_memory_at_tokens"] is None and sweep["largest_tokens_run"] == 256
    assert row["kind"] == "train" and row["devices"] == 3 and row["returncode"] == 1
    assert row["error"] == "--devices 3: only 2 devices here"
    assert row["stderr_tail"][-1] == row["error"] and not row["timed_out"]


def test_a_child_over_the_timeout_is_killed_and_reported():
    code, report, _ = bench(
        "--devices", "1", "--workers", "2", "--decode-sentences", "0", "--timeout", "0.5"
    )  # fmt: skip
    assert code == 1
    assert report["environment"]["timed_out"] and report["devices_available"] == 2
    row, job = report["results"]
    for failed in (row, job):
        assert failed["timed_out"] and failed["returncode"] is None
        assert failed["error"] == "timed out after 0.5 s (--timeout): killed"
    # a job of local workers: every process killed, the row names the first unfinished task
    assert job["devices"] == 2 and job["failed_task"] == "worker:0"


def test_kt_train_mode_counts_lengths_with_a_runs_tokenizer(tmp_path, multi30k_dir):
    """--tokenizer RUN_DIR: each pair's lengths are its pieces by that run's spm.model (+ eos,
    + bos), not the words x --pieces-per-word estimate."""
    import argparse

    from gpu import shapes

    from keras_transformer.data.tokenizer import SubwordTokenizer, train_sentencepiece
    from keras_transformer.run_dir import Run

    paths = [os.path.join(multi30k_dir, f"val.{lang}.gz") for lang in ("en", "de")]
    sides = [shapes.read_lines(path, 300) for path in paths]
    proto = train_sentencepiece([line.strip() for side in sides for line in side], 500)
    Run(str(tmp_path)).save_tokenizer(SubwordTokenizer(proto))
    opts = argparse.Namespace(corpus=paths, pairs=40, tokenizer=str(tmp_path), pieces_per_word=1.3)
    lengths = shapes.pair_lengths(opts)
    tokenizer = SubwordTokenizer(proto)
    expected = [
        [len(tokenizer.tokenize([line.strip()])[0]) + 1 for line in (src, tgt)]
        for src, tgt in zip(sides[0][:40], sides[1][:40])
    ]
    assert lengths.tolist() == expected
    assert shapes.length_source(opts) == f"tokenizer of {tmp_path}"
    estimated = shapes.pair_lengths(argparse.Namespace(**{**vars(opts), "tokenizer": None}))
    assert estimated.shape == lengths.shape and (estimated != lengths).any()
