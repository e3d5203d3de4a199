"""benchmarks/bench_checkpoint.py runs as it is (tiny model): the synchronous save times,
what TensorFlow's asynchronous checkpoint does with this model's Keras variables, and
kt-train's --async-checkpoint."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_benchmark():
    path = os.path.join(ROOT, "benchmarks", "bench_checkpoint.py")
    spec = importlib.util.spec_from_file_location("bench_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_sync_saves_are_timed_and_async_stops_at_its_second_save(tmp_path):
    """TF 2.21 + Keras 3.15: TensorFlow's own first asynchronous save works, the second fails
    (Keras' variable copies itself into a new tf.Variable inside TensorFlow's tf.function):
    a tripwire for `training.async_checkpoint`'s fix of that method, which kt-train's
    --async-checkpoint uses (all its saves timed here). When the tripwire fails, TensorFlow
    or Keras fixed it and the fix can go (docs/benchmarks.md, docs/gpu.md)."""
    result = load_benchmark().main(["--preset", "tiny", "--repeats", "2", "--dir", str(tmp_path)])
    assert len(result["sync"]["blocked_s"]) == 2 and "error" not in result["sync"]
    assert 20 < result["checkpoint_mb"] < 30  # 2.2 M weights + 2 Adam slots, float32
    assert len(result["async"]["blocked_s"]) == 1
    assert result["async"]["error"].startswith("save 2: ValueError: tf.function only supports")
    kt_async = result["kt_async"]
    assert "error" not in kt_async and len(kt_async["blocked_s"]) == len(kt_async["write_s"]) == 2
    assert os.listdir(tmp_path) == []  # the benchmark cleans up
