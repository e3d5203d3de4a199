"""`model_state.restore`: the newest checkpoint, then the check that every worker is at the
chief's step."""

from __future__ import annotations

import types

import tensorflow as tf

from keras_transformer.run_dir import RunState
from keras_transformer.training import model_state
from keras_transformer.training.job import Job


class Metrics:
    def resume(self, restored: bool = True) -> None:
        self.restored = restored


def test_restore_without_a_checkpoint_still_checks_every_workers_step(tmp_path, monkeypatch):
    """A run with nothing to restore is at step 0 on every worker, and says so in the
    collective check (a worker that did restore would stop the job there)."""
    checked = []
    monkeypatch.setattr(model_state, "check_restored_step", lambda job, s: checked.append(s))
    job = Job(tf.distribute.get_strategy(), None, RunState.read(str(tmp_path)))
    model = types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=tf.Variable(0)))
    metrics = Metrics()
    assert model_state.restore(job, None, model, None, metrics) == 0
    assert checked == [0] and metrics.restored is False
