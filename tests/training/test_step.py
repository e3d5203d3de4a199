"""TrainingModel under a strategy: `fit` builds and reads the training stream once, and the
input pipeline's state stays on the CPU."""

import re

import pytest
import tensorflow as tf

from keras_transformer.run_dir import Run
from tests.training.scripts import run_scripts, script_result, selected_tests
from tests.training.small_corpus import train_argv, write_corpus

RUNS = (("one", []), ("two", ["--cpu-devices", "2", "--strategy", "mirrored"]))


@pytest.fixture(scope="module")
def commands(request, tmp_path_factory):
    """The selected tests' scripts and kt-train runs, run once in one process tree (one
    import of TensorFlow, a forked child each: tests/training/scripts.py), by name; the
    kt-train runs' folder under "dir"."""
    tests, work = selected_tests(request), tmp_path_factory.mktemp("step")
    commands = {}
    if "test_fit_under_a_strategy_builds_and_reads_the_stream_once" in tests:
        commands["stream"] = ["replica_stream.py"]
    if "test_a_step_issues_at_most_three_scalar_collectives_besides_the_gradients" in tests:
        commands["collectives"] = ["replica_collectives.py"]
    if "test_one_device_and_two_cpus_drop_the_same_pairs_and_read_the_same_batches" in tests:
        multi30k_dir = request.getfixturevalue("multi30k_dir")
        flags = write_corpus(work / "corpus", multi30k_dir, 0, 1500)
        flags += ["--train-steps", "3", "--steps-per-epoch", "3", "--eval-every", "100"]
        for name, extra in RUNS:
            commands[name] = train_argv(work / name, *flags, *extra)
    return {**run_scripts(commands), "dir": work}


@pytest.mark.slow
def test_fit_under_a_strategy_builds_and_reads_the_stream_once(commands):
    """Keras' symbolic build under a strategy read a first batch from an iterator of its own,
    then threw it away: the stream was built and read twice. The pipeline's counter is made
    on CPU:0 even under another device's scope (the first accelerator, on a GPU machine)."""
    result = script_result(commands["stream"])
    assert result["replicas"] == 2
    assert result["mirrored_reads"] == result["default_reads"] == 1
    assert result["counter_device"].endswith("/device:CPU:0")


@pytest.mark.slow
def test_one_device_and_two_cpus_drop_the_same_pairs_and_read_the_same_batches(commands):
    """`--cpu-devices 2 --strategy mirrored` reads the training stream as one device does:
    the same dropped-pairs count (it was doubled), the same stream position after 3 steps."""
    dropped, positions = [], []
    for name, _ in RUNS:
        out = commands[name]
        assert out.returncode == 0, out.stderr[-3000:]
        dropped.append(int(re.search(r"dropped (\d+) training pairs", out.stdout).group(1)))
        reader = tf.train.load_checkpoint(Run(str(commands["dir"] / name)).checkpoints()[-1])
        positions.append(
            [
                reader.get_tensor(f"{key}/.ATTRIBUTES/VARIABLE_VALUE")
                for key in ("data_position", "data_next")
            ]
        )
    assert dropped[0] == dropped[1] > 0
    assert positions[0] == positions[1] == [3, 3]


@pytest.mark.slow
def test_a_step_issues_at_most_three_scalar_collectives_besides_the_gradients(commands):
    """Under the collective strategy of `--strategy multi_worker` (2 logical CPUs, Keras'
    cross-worker reduction of the logs traced too), one replica's step issued 9 scalar
    collectives in float32 (token count, two all-gathers of two ops each, two per log) and 13
    with float16 loss scaling (two finite flags, one more log), then 3 and 4 (the flags in an
    all-reduce of their own). Now 3 in both: the step scalars in one all-reduce, the logs in
    one Keras reduction (two ops), float16's loss flag in the gradients' all-reduce, which
    the step issues and the optimizer does not repeat (a second one would count 2)."""
    result = script_result(commands["collectives"])
    float32, float16 = result["float32"], result["mixed_float16"]
    assert float32["replicas"] == float16["replicas"] == 2
    assert float32["gradients"] == float16["gradients"] == 1
    assert float32["scalars"] == {"CollectiveReduceV2": 3}
    assert float16["scalars"] == {"CollectiveReduceV2": 3}
