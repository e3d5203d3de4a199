"""The scheduler's ordinary events against local worker processes (slow: a few tiny jobs).

Each case is bounded in time and asserts its outcome; `benchmarks/cluster_faults.py` runs
them and prints a JSON table (case, outcome, seconds)."""

import os
import signal
import subprocess
import time

import psutil
import pytest

from keras_transformer.run_dir import Run
from tests.training.test_cluster import finish, start_job, wait_for_step
from tests.training.test_trainer import train_cmd

THREAD_STEPS = 1000  # the thread-count case: 167 s on 2 cores (150 steps: 75 s)
JOB = ["--strategy", "multi_worker", "--checkpoint-every", "1000", "--eval-every", "100000",
       "--log-every", "1", "--warmup-steps", "10", "--eval-sentences", "4"]  # fmt: skip


@pytest.mark.slow
def test_the_collective_timeout_keeps_the_thread_count_flat(tmp_path, multi30k_dir):
    """Two local workers with --collective-timeout 600: a worker's thread count at step 990
    of 1,000 is within a few threads of its count after 20 (TensorFlow's per-collective
    timeout added about 22 threads a step a worker)."""
    total = str(THREAD_STEPS)
    steps = ["--train-steps", total, "--steps-per-epoch", total, "--collective-timeout", "600"]
    tasks = start_job(("worker", "worker"), train_cmd(tmp_path / "job", multi30k_dir, *JOB, *steps))
    try:
        wait_for_step(tmp_path / "job", 20, tasks, timeout=300)
        worker = psutil.Process(tasks[1][1].pid)
        early = worker.num_threads()
        wait_for_step(tmp_path / "job", THREAD_STEPS - 10, tasks, timeout=600)
        late = worker.num_threads()
    finally:
        outputs = finish(tasks, timeout=300)
    assert late - early <= 8, (early, late)
    assert f"training ended at step {total} of {total}" in outputs["worker:0"]


@pytest.mark.slow
def test_sigint_to_one_worker_saves_everywhere_and_exits_130(tmp_path, multi30k_dir):
    """Ctrl-C (SIGINT) to worker 1 of two: both stop after the same batch, the chief saves
    there, both exit 130 within the bound, no traceback."""
    steps = ["--train-steps", "400", "--steps-per-epoch", "400"]
    tasks = start_job(("worker", "worker"), train_cmd(tmp_path / "job", multi30k_dir, *JOB, *steps))
    wait_for_step(tmp_path / "job", 3, tasks, timeout=300)
    start = time.time()
    tasks[1][1].send_signal(signal.SIGINT)
    outputs = finish(tasks, timeout=120, codes=(130,))
    assert time.time() - start < 120
    saved = Run(str(tmp_path / "job")).checkpoints()
    assert len(saved) == 1 and all("stopped by SIGINT" in out for out in outputs.values())
    assert not [p for p in os.listdir(tmp_path / "job") if p.startswith("worker")]


@pytest.mark.slow
def test_sigkill_of_a_worker_ends_the_job_and_a_restart_resumes(tmp_path, multi30k_dir):
    """SIGKILL of worker 1 of two once the chief logged step 4 (checkpoints every 2 steps):
    the chief, blocked in a collective, exits non-zero within --collective-timeout plus a
    margin instead of hanging (the clock starts after the first batch: a 40 s clock that
    counted the first step's tracing ended a healthy job on CI); the same command on both
    workers then resumes from the last checkpoint and ends the run."""
    steps = ["--train-steps", "10", "--steps-per-epoch", "10", "--checkpoint-every", "2",
             "--collective-timeout", "40"]  # fmt: skip
    command = train_cmd(tmp_path / "job", multi30k_dir, *JOB, *steps)
    tasks = start_job(("worker", "worker"), command)
    wait_for_step(tmp_path / "job", 4, tasks, timeout=300)
    start = time.time()
    tasks[1][1].kill()
    chief = tasks[0][1]
    try:
        chief.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        chief.kill()
        raise AssertionError("the chief hung after its peer's SIGKILL") from None
    assert chief.returncode != 0 and time.time() - start < 40 + 45
    saved = Run(str(tmp_path / "job")).checkpoints()[-1].rsplit("-", 1)[1]
    outputs = finish(start_job(("worker", "worker"), command), timeout=300)
    assert all(f"at step {saved}" in out for out in outputs.values())
    assert "training ended at step 10 of 10" in outputs["worker:0"]
    assert [r["step"] for r in Run(str(tmp_path / "job")).read_metrics()
            if r["event"] == "train"].count(10) == 1  # fmt: skip
