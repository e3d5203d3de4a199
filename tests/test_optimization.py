import keras
import pytest

from keras_transformer import WarmupSchedule, paper_optimizer


def test_schedule_is_equation_3():
    schedule = WarmupSchedule(d_model=512, warmup_steps=4000)
    for step in (1, 100, 4000, 10000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert float(schedule(step - 1)) == pytest.approx(expected, rel=1e-5)
    # the peak is at warmup_steps
    assert float(schedule(3999)) > float(schedule(2000)) and float(schedule(3999)) > float(
        schedule(8000)
    )


def test_schedule_and_optimizer_serialize():
    optimizer = paper_optimizer(256, warmup_steps=1000, scale=2.0)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(restored.learning_rate, WarmupSchedule) or isinstance(
        restored._learning_rate, WarmupSchedule
    )
    assert restored._learning_rate.get_config() == {
        "d_model": 256,
        "warmup_steps": 1000,
        "scale": 2.0,
    }


def test_bad_schedule_arguments():
    with pytest.raises(ValueError, match="positive"):
        WarmupSchedule(d_model=512, warmup_steps=0)
