"""The start-up check of a multi-worker job (training.startup), with local processes: a
chief whose device count differs from its workers' stops every task within seconds, in
one line naming both counts, before the first collective (it used to hang or crash there).
On CPU every task has one device, so the probe gives each task type its count."""

import os
import subprocess
import sys
import time

import pytest

from tests.cli_contract import assert_clean_failure
from tests.training.test_cluster import start_job

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup_probe.py")


def outcomes(tasks, timeout):
    """{task: CompletedProcess (bytes)} once every process has exited."""
    done = {}
    try:
        for name, proc in tasks:
            out, err = proc.communicate(timeout=timeout)
            done[name] = subprocess.CompletedProcess(
                proc.args, proc.returncode, out.encode(), err.encode()
            )
    finally:
        for _, proc in tasks:
            proc.kill()
    return done


@pytest.mark.slow
@pytest.mark.parametrize("chief, worker", [(4, 8), (1, 1)])
def test_a_chief_with_another_device_count_stops_every_task_in_one_line(tmp_path, chief, worker):
    """{chief, worker x2}, the chief with `chief` devices, the workers `worker`: different,
    every task exits 2 within 60 s with one line naming the chief's count and a worker's;
    the same, every task passes the check."""
    start = time.time()
    command = [sys.executable, PROBE, f"chief={chief}", f"worker={worker}"]
    if chief == worker:  # and one shared run directory: the directory check passes
        command += [f"dir_chief={tmp_path}", f"dir_worker={tmp_path}"]
    done = outcomes(start_job(("chief", "worker", "worker"), command), timeout=90)
    assert time.time() - start < 60
    for out in done.values():
        if chief == worker:
            assert out.returncode == 0 and b"same layout" in out.stdout, out.stderr[-2000:]
            assert os.listdir(tmp_path) == []  # the chief removed its start-up file
            continue
        assert_clean_failure(
            out, "kt-train", ["chief chief:0 has 4 devices", "worker:0 has 8 devices"]
        )


@pytest.mark.slow
def test_a_run_directory_only_the_chief_sees_stops_every_task_in_one_line(tmp_path):
    """{chief, worker x2}, the workers given a --model-dir that is not the chief's (a
    node-local directory): every task exits 2 within 60 s, in one line naming the first
    worker and the directory, instead of the workers waiting hours for config.json."""
    start = time.time()
    chief_dir, worker_dir = tmp_path / "chief", tmp_path / "node-local"
    command = [sys.executable, PROBE, "chief=1", "worker=1"]
    command += [f"dir_chief={chief_dir}", f"dir_worker={worker_dir}"]
    done = outcomes(start_job(("chief", "worker", "worker"), command), timeout=90)
    assert time.time() - start < 60
    for out in done.values():
        assert_clean_failure(
            out,
            "kt-train",
            ["worker:0 cannot see the run directory", "chief chief:0", "--model-dir"],
        )
