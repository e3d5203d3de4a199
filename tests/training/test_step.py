"""TrainingModel under a strategy: `fit` builds and reads the training stream once, and the
input pipeline's state stays on the CPU."""

import re

import pytest
import tensorflow as tf

from keras_transformer.run_dir import Run
from tests.training.small_corpus import run_commands, train_argv, write_corpus
from tests.training.test_strategy import run_script


@pytest.mark.slow
def test_fit_under_a_strategy_builds_and_reads_the_stream_once():
    """Keras' symbolic build under a strategy read a first batch from an iterator of its own,
    then threw it away: the stream was built and read twice. The pipeline's counter is made
    on CPU:0 even under another device's scope (the first accelerator, on a GPU machine)."""
    result = run_script("replica_stream.py")
    assert result["replicas"] == 2
    assert result["mirrored_reads"] == result["default_reads"] == 1
    assert result["counter_device"].endswith("/device:CPU:0")


@pytest.mark.slow
def test_one_device_and_two_cpus_drop_the_same_pairs_and_read_the_same_batches(
    tmp_path, multi30k_dir
):
    """`--cpu-devices 2 --strategy mirrored` reads the training stream as one device does:
    the same dropped-pairs count (it was doubled), the same stream position after 3 steps."""
    flags = write_corpus(tmp_path / "corpus", multi30k_dir, 0, 1500)
    flags += ["--train-steps", "3", "--steps-per-epoch", "3", "--eval-every", "100"]
    runs = (("one", []), ("two", ["--cpu-devices", "2", "--strategy", "mirrored"]))
    outs = run_commands(*(train_argv(tmp_path / name, *flags, *extra) for name, extra in runs))
    dropped, positions = [], []
    for (name, _), out in zip(runs, outs):
        dropped.append(int(re.search(r"dropped (\d+) training pairs", out.stdout).group(1)))
        reader = tf.train.load_checkpoint(Run(str(tmp_path / name)).checkpoints()[-1])
        positions.append(
            [
                reader.get_tensor(f"{key}/.ATTRIBUTES/VARIABLE_VALUE")
                for key in ("data_position", "data_next")
            ]
        )
    assert dropped[0] == dropped[1] > 0
    assert positions[0] == positions[1] == [3, 3]


@pytest.mark.slow
def test_a_step_issues_at_most_three_scalar_collectives_besides_the_gradients():
    """Under the collective strategy of `--strategy multi_worker` (2 logical CPUs, Keras'
    cross-worker reduction of the logs traced too), one replica's step issued 9 scalar
    collectives in float32 (token count, two all-gathers of two ops each, two per log) and 13
    with float16 loss scaling (two finite flags, one more log), then 3 and 4 (the flags in an
    all-reduce of their own). Now 3 in both: the step scalars in one all-reduce, the logs in
    one Keras reduction (two ops), float16's loss flag in the gradients' all-reduce, which
    the step issues and the optimizer does not repeat (a second one would count 2)."""
    result = run_script("replica_collectives.py")
    float32, float16 = result["float32"], result["mixed_float16"]
    assert float32["replicas"] == float16["replicas"] == 2
    assert float32["gradients"] == float16["gradients"] == 1
    assert float32["scalars"] == {"CollectiveReduceV2": 3}
    assert float16["scalars"] == {"CollectiveReduceV2": 3}
