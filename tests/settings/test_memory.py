import pytest

from keras_transformer.settings import memory, recipe
from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.recipe import resolve


def never(*_):
    raise AssertionError("not called")


def wmt_base(**flags):
    args = TrainArgs(preset="base", steps_per_epoch=1, **flags)
    return resolve(args, num_pairs=4_500_000, batches_per_pass=never)


def test_the_bound_is_a_quarter_of_the_gpu_and_the_p100_default_without_one():
    assert memory.device_memory_gib() is None  # no GPU on this machine
    assert memory.micro_batch_memory_gib() == memory.MICRO_BATCH_MEMORY_GIB == 4.0
    assert memory.micro_batch_memory_gib(16.0) == 4.0  # the paper's P100: as before
    assert memory.micro_batch_memory_gib(79.2) == 19.8  # an 80 GB H100 (TF's memory_limit)


def test_an_80_gb_gpu_gets_fewer_micro_batches(monkeypatch):
    """WMT base, 25000-token update: 10 micro-batches of 2500 tokens in 4 GiB (float32, a
    16 GB GPU); an 80 GB one (19.8 GiB for the step) 2 of 12500."""
    assert (wmt_base().accum_steps, wmt_base().micro_batch_memory) == (10, 4.0)
    monkeypatch.setattr(
        recipe, "micro_batch_memory_gib", lambda: memory.micro_batch_memory_gib(79.2)
    )
    out = wmt_base()
    assert (out.accum_steps, out.batch_tokens, out.micro_batch_memory) == (2, 12500, 19.8)


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_16_bit_activations_fit_more_tokens(precision):
    float32 = memory.step_bytes_per_token("base", 37000, 128)
    mixed = memory.step_bytes_per_token("base", 37000, 128, precision)
    assert float32 == 4 * memory.step_floats_per_token("base", 37000, 128)
    assert 0.5 * float32 < mixed < float32
    assert wmt_base(precision=precision).accum_steps < wmt_base().accum_steps


def test_the_gpu_memory_is_read_through_public_interfaces_and_the_bound_logged(caplog):
    """The smallest GPU's memory (as the driver reports it, `total_mib`), and the bound that
    --micro-batch-memory gets from it, logged; without a GPU, the 4 GiB default, logged."""
    import tensorflow as tf

    two = tf.config.list_physical_devices("CPU") * 2  # stand-ins: no logical configuration
    sizes = {0: 81559.0, 1: 40960.0}
    assert memory.device_memory_gib(two, total_mib=sizes.get) == 40.0
    assert memory.device_memory_gib([], total_mib=sizes.get) is None
    with caplog.at_level("INFO", logger="keras_transformer"):
        assert memory.micro_batch_memory_gib(40.0) == 10.0
        assert memory.micro_batch_memory_gib() == 4.0
    assert "micro-batch memory bound: 10 GiB per replica (0.25 of the smallest GPU's 40 GiB)" in (
        caplog.text
    )
    assert "micro-batch memory bound: 4 GiB per replica (no GPU memory to read)" in caplog.text
