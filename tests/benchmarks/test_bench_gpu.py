"""benchmarks/bench_gpu.py runs as it is (here on 2 logical CPUs, tiny settings): one
command, JSON whose keys and values are sane for every configuration."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_bench_gpu_runs_on_cpu_and_reports_every_configuration():
    command = [
        sys.executable, os.path.join(ROOT, "benchmarks", "bench_gpu.py"),
        "--preset", "tiny", "--vocab-size", "64", "--precision", "mixed_bfloat16",
        "--cpu-devices", "2", "--devices", "1", "all", "--xla", "off", "on",
        "--rows", "4", "--length", "6", "--accum-steps", "2", "--steps", "2", "--warmup", "1",
        "--decode-sentences", "4", "--decode-length", "5", "--decode-rounds", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["devices_available"] == 2
    train = [r for r in report["results"] if r["kind"] == "train"]
    assert [(r["devices"], r["xla"]) for r in train] == [
        (1, False), (1, True), (2, False), (2, True)
    ]  # fmt: skip
    for row in train:
        assert "error" not in row, row
        assert row["device_type"] == "CPU" and row["peak_device_memory_mib"] is None
        assert row["global_rows"] == 4 * row["devices"] * 2
        assert row["optimizer_steps"] == 3  # warmup + timed steps, one update each
        assert row["traces"] == 1  # one fixed shape: one graph
        assert row["xla_programs"] == (row["devices"] if row["xla"] else 0)  # one a replica
        assert row["target_tokens_per_s"] > 0 and row["step_s_median"] > 0
        assert row["first_step_s"] > 0 and row["peak_rss_mib"] > 0
    (decode,) = [r for r in report["results"] if r["kind"] == "decode"]
    assert decode["sentences"] == 4 and decode["sentences_per_s"] > 0
