import time

from keras_transformer.training.watchdog import EXIT_CODE, ProgressWatchdog


def test_no_progress_for_the_timeout_ends_the_process_once(caplog):
    exits = []
    watchdog = ProgressWatchdog(0.4, exit=exits.append)
    try:
        for _ in range(6):  # progress every 0.1 s: never fires
            time.sleep(0.1)
            watchdog.on_train_batch_end(0)
        assert exits == []
        time.sleep(1.2)  # stuck in a collective
        assert exits == [EXIT_CODE] == [1]
        assert (
            "no training progress in" in caplog.text and "--collective-timeout 0.4" in caplog.text
        )
    finally:
        watchdog.close()


def test_validation_batches_and_epoch_ends_are_progress():
    exits = []
    watchdog = ProgressWatchdog(0.4, exit=exits.append)
    try:
        watchdog.on_train_batch_end(0)
        for hook in ["on_test_begin", "on_test_batch_end", "on_epoch_end", "on_epoch_begin"] * 2:
            time.sleep(0.15)
            getattr(watchdog, hook)(0)
        assert exits == []
    finally:
        watchdog.close()
    assert not watchdog.thread.is_alive()


def test_the_clock_starts_at_the_end_of_the_first_training_batch():
    """The first batch traces (and under XLA compiles) the step: not timed, however long;
    validation and epoch hooks before it do not arm the watchdog either."""
    exits = []
    watchdog = ProgressWatchdog(0.4, exit=exits.append)
    try:
        watchdog.on_epoch_begin(0)
        time.sleep(1.2)  # tracing the first step
        assert exits == []
        watchdog.on_train_batch_end(0)
        time.sleep(1.2)  # then stuck
        assert exits == [EXIT_CODE]
    finally:
        watchdog.close()
