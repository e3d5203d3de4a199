"""A resume under another replica layout, in real kt-train jobs (slow: a few tiny jobs).

A run on 2 logical CPU devices (`--cpu-devices 2 --strategy mirrored`, one input stream)
stopped by SIGTERM, resumed on 1 device (the same stream: resumed exactly, no warning) and
as 2 local `multi_worker` processes (a stream per worker: re-sharded at the chunk start,
one warning line per task); a job of 3 local workers preempted at an epoch's last batch,
resumed as 2 workers."""

import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer.run_dir import Run
from keras_transformer.training.callbacks import KILL_AT_ENV
from keras_transformer.training.layout import chunk_start
from tests.training.small_corpus import ROOT, TINY, write_corpus
from tests.training.test_cluster import finish, start_job

STEPS = ["--train-steps", "6", "--steps-per-epoch", "6", "--checkpoint-every", "1000",
         "--eval-every", "100000", "--log-every", "1", "--eval-sentences", "4"]  # fmt: skip
SAVED = 3  # SIGTERM after batch 2: saved after the next one
RESIZED = "the checkpoint was written with"


def command(model_dir, corpus, *extra):
    return [sys.executable, os.path.join(ROOT, "train.py"), "--model-dir", str(model_dir),
            *TINY, *corpus, *STEPS, *extra]  # fmt: skip


def saved_value(path, name):
    return tf.train.load_checkpoint(path).get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")


@pytest.fixture(scope="module")
def mirrored(tmp_path_factory, multi30k_dir):
    """(corpus flags, the run directory of a 2-device mirrored run stopped by SIGTERM)."""
    base = tmp_path_factory.mktemp("resize")
    corpus = write_corpus(base / "corpus", multi30k_dir, 0, 600)
    model_dir = base / "mirrored"
    out = subprocess.run(
        command(model_dir, corpus, "--cpu-devices", "2", "--strategy", "mirrored"),
        capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, KILL_AT_ENV: f"{SAVED - 1}:batch:SIGTERM"},
    )  # fmt: skip
    assert out.returncode == 143, out.stderr[-3000:]
    assert [p.rsplit("-", 1)[1] for p in Run(str(model_dir)).checkpoints()] == [str(SAVED)]
    return corpus, model_dir


def resumed_copy(mirrored, tmp_path):
    corpus, model_dir = mirrored
    copy = tmp_path / "resumed"
    shutil.copytree(model_dir, copy)
    return corpus, copy


@pytest.mark.slow
def test_a_mirrored_run_resumes_on_one_device_exactly(mirrored, tmp_path):
    """2 devices under `mirrored` -> 1 device: the same single stream (the replicas split
    one stream's batches), so no re-sharding and no warning: the run goes on from the
    saved next position, one batch a step (no batch read twice or skipped)."""
    corpus, model_dir = resumed_copy(mirrored, tmp_path)
    saved = int(saved_value(Run(str(model_dir)).checkpoints()[-1], "data_next"))
    out = subprocess.run(
        command(model_dir, corpus, "--cpu-devices", "1"), capture_output=True, text=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"at step {SAVED}" in out.stdout and RESIZED not in out.stdout + out.stderr
    final = Run(str(model_dir)).checkpoints()[-1]
    assert final.endswith("ckpt-6") and int(saved_value(final, "data_next")) == saved + 6 - SAVED


@pytest.mark.slow
def test_a_mirrored_run_resumes_as_two_workers_from_its_chunk_start(mirrored, tmp_path):
    """2 devices under `mirrored` -> 2 `multi_worker` processes (a stream per worker): each
    task warns once, naming both layouts and the chunk start S of the saved position; each
    worker reads its share (pairs w, w + 2, ... of the pass's order) from S, one batch a
    step: within the pass from S on, no pair is read twice and none is skipped (the shares
    are disjoint and cover the pass: tests/data/test_pipeline.py); the batches the mirrored
    run trained on since S are trained on again, as the warning says."""
    corpus, model_dir = resumed_copy(mirrored, tmp_path)
    saved = int(saved_value(Run(str(model_dir)).checkpoints()[-1], "data_next"))
    start = chunk_start([saved])
    assert 0 <= start < saved  # the chunk the mirrored run was in (Multi30k: one a pass)
    outputs = finish(start_job(("worker", "worker"), command(model_dir, corpus, "--strategy",
                                                             "multi_worker")))  # fmt: skip
    for w, out in enumerate(outputs.values()):
        warnings = [line for line in out.splitlines() if RESIZED in line]
        assert len(warnings) == 1, out
        assert "with one input stream" in warnings[0] and "2 worker stream(s)" in warnings[0]
        assert f"(stream position {start})" in warnings[0]
        assert f"at step {SAVED}" in out
        assert f"(share {w + 1} of 2), from stream position {start}" in out
    final = Run(str(model_dir)).checkpoints()[-1]
    assert final.endswith("ckpt-6") and int(saved_value(final, "input_workers")) == 2
    assert list(saved_value(final, "replica_next")) == [start + 6 - SAVED] * 2


@pytest.mark.slow
def test_three_workers_preempted_at_an_epochs_last_batch_resume_as_two(tmp_path, multi30k_dir):
    """3 local `multi_worker` processes, 4 steps an epoch; SIGTERM to worker 1 after batch 3
    (the save falls on the epoch's last batch): every task exits 143, the chief's checkpoint
    at step 4 follows that epoch's end (its epoch and BLEU events, best/). Restarted as 2
    workers: one warning line per task naming both layouts and the chunk start S, resumed at
    step 4 without redoing or skipping that epoch's end (each epoch event once); with
    --checkpoint-every 2 (a flag a resume may change), SIGTERM to the chief inside its
    step-6 save (after the data files, before the state file; the chief alone saves, so a
    non-chief has no save to signal): that save completes (ckpt-6 listed and restorable),
    every task exits 143 with one "stopped by SIGTERM" line, the chief saved after one more
    batch (ckpt-7). Started again, the job ends at step 8 with each epoch event once and
    each worker's stream at S + 4 (docs/training.md: re-sharded at S)."""
    corpus = write_corpus(tmp_path / "corpus", multi30k_dir, 0, 600)
    model_dir = tmp_path / "job"
    job = command(model_dir, corpus, "--strategy", "multi_worker", "--steps-per-epoch", "4",
                  "--train-steps", "8")  # fmt: skip
    signal_at = {"worker:1": {KILL_AT_ENV: "3:batch:SIGTERM"}}
    outputs = finish(start_job(("worker",) * 3, job, task_env=signal_at), codes=(143,))
    assert all("after batch 4" in out for out in outputs.values()), outputs
    run = Run(str(model_dir))
    assert [p.rsplit("-", 1)[1] for p in run.checkpoints()] == ["4"]
    events = [(r["event"], r["step"]) for r in run.read_metrics()]
    assert events.count(("epoch", 4)) == 1 and events.count(("bleu", 4)) == 1, events
    assert run.checkpoints(best=True)
    saved = saved_value(run.checkpoints()[-1], "replica_next")
    assert len(saved) == 3 and int(saved_value(run.checkpoints()[-1], "input_workers")) == 3
    start = chunk_start(saved)

    in_save = {"worker:0": {KILL_AT_ENV: "6:save:SIGTERM"}}  # the chief: the one that saves
    every_2 = [*job, "--checkpoint-every", "2"]
    tasks = start_job(("worker", "worker"), every_2, task_env=in_save)
    outputs = finish(tasks, timeout=240, codes=(143,))  # no hang: every task within 240 s
    for out in outputs.values():
        warnings = [line for line in out.splitlines() if RESIZED in line]
        assert len(warnings) == 1, out
        assert "3 worker stream(s)" in warnings[0] and "2 worker stream(s)" in warnings[0]
        assert f"(stream position {start})" in warnings[0] and "at step 4" in out
        assert out.count("stopped by SIGTERM") == 1, out
    assert [p.rsplit("-", 1)[1] for p in run.checkpoints()] == ["4", "6", "7"]
    assert int(saved_value(run.checkpoints()[1], "input_workers")) == 2  # ckpt-6 restorable

    outputs = finish(start_job(("worker", "worker"), job))
    assert all("at step 7" in out and RESIZED not in out for out in outputs.values())
    assert "training ended at step 8 of 8" in outputs["worker:0"]
    events = [(r["event"], r["step"]) for r in run.read_metrics()]
    assert events.count(("epoch", 4)) == 1 and events.count(("epoch", 8)) == 1, events
    final = run.checkpoints()[-1]
    assert final.endswith("ckpt-8") and int(saved_value(final, "input_workers")) == 2
    assert list(saved_value(final, "replica_next")) == [start + 8 - 4] * 2
