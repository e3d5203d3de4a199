import os
import signal

import pytest
import tensorflow as tf

from keras_transformer.training.preemption import EXIT_CODE, Preempted, PreemptionSave


def test_sigterm_on_one_machine_saves_after_the_next_batch_and_exits_143():
    position, saved = [0], []
    previous = signal.getsignal(signal.SIGTERM)

    def save():
        saved.append(position[0])
        return f"ckpt-{position[0]}"

    callback = PreemptionSave(tf.distribute.get_strategy(), lambda: position[0], save)
    try:
        for batch in range(1, 4):
            position[0] = batch
            callback.on_train_batch_end(batch)
        assert saved == []  # no signal, no save
        os.kill(os.getpid(), signal.SIGTERM)  # handled: the process lives on
        position[0] = 4
        callback.on_train_batch_end(4)  # the target: after batch 5
        assert saved == []
        position[0] = 5
        with pytest.raises(Preempted) as stopped:
            callback.on_train_batch_end(5)
        assert stopped.value.code == EXIT_CODE == 143
        assert saved == [5] and "ckpt-5" in stopped.value.message
        assert signal.getsignal(signal.SIGTERM) == previous  # restored on the way out
    finally:
        callback.close()
        signal.signal(signal.SIGTERM, previous)


def test_close_restores_the_previous_handler():
    previous = signal.getsignal(signal.SIGTERM)
    callback = PreemptionSave(tf.distribute.get_strategy(), lambda: 0, lambda: None)
    assert signal.getsignal(signal.SIGTERM) != previous
    callback.close()
    assert signal.getsignal(signal.SIGTERM) == previous
