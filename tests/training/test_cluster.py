"""A real cluster's layouts and events, with local processes: who is the chief, a job with a
"chief" task writing one run directory once, a SIGTERM to one worker (preemption)."""

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import sacrebleu

from keras_transformer.run_dir import Run
from tests.training.test_trainer import ROOT, assert_same_variables, run_workers, train_cmd

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_job(layout, command, extra_env=None, task_env=None):
    """One local process per task of `layout` (e.g. ("chief", "worker", "worker")), each with
    its TF_CONFIG (and `task_env[task name]`, e.g. {"worker:1": {...}}); returns
    [(task name, Popen)]."""
    cluster = {}
    for kind in layout:
        cluster.setdefault(kind, []).append(f"127.0.0.1:{free_port()}")
    env = {**os.environ, "PYTHONPATH": ROOT, **(extra_env or {})}
    tasks = []
    for kind, addresses in cluster.items():
        for index in range(len(addresses)):
            config = {"cluster": cluster, "task": {"type": kind, "index": index}}
            own = (task_env or {}).get(f"{kind}:{index}", {})
            proc = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, **own, "TF_CONFIG": json.dumps(config)},
                cwd=ROOT,
            )
            tasks.append((f"{kind}:{index}", proc))
    return tasks


def finish(tasks, timeout=420, codes=(0,)):
    """{task: stdout} once every process has exited with one of `codes`."""
    outputs = {}
    for name, proc in tasks:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for _, p in tasks:
                p.kill()
            raise AssertionError(f"{name} hung (blocked in a collective?)") from None
        assert proc.returncode in codes, f"{name} exited {proc.returncode}: {err[-3000:]}"
        outputs[name] = out
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout,chief",
    [(("worker", "worker"), "worker:0"), (("chief", "worker", "worker"), "chief:0")],
)
def test_the_chief_is_tensorflows_chief(layout, chief):
    """Worker 0 when TF_CONFIG has no "chief" task; the "chief" task (not also worker 0)
    when it has one, as Kubeflow's TFJob and Vertex AI write it."""
    tasks = start_job(layout, [sys.executable, os.path.join(HERE, "chief_probe.py")])
    answers = [json.loads(out.strip().splitlines()[-1]) for out in finish(tasks).values()]
    assert [a["task"] for a in answers if a["chief"]] == [chief]
    assert len(answers) == len(layout)


@pytest.mark.slow
def test_a_job_with_a_chief_task_writes_the_run_directory_once(tmp_path, multi30k_dir):
    """{chief, worker x2}: the chief alone writes config.json, spm.model, metrics.jsonl,
    checkpoints/ and best/ (each event once); the workers leave nothing in the run. With
    --jit-compile: XLA compiles each replica's forward and backward pass, the cross-worker
    all-reduce stays outside it."""
    model_dir = tmp_path / "job"
    args = ["--train-steps", "4", "--steps-per-epoch", "4", "--checkpoint-every", "2",
            "--eval-every", "2", "--log-every", "1", "--eval-sentences", "4",
            "--jit-compile"]  # fmt: skip
    command = train_cmd(model_dir, multi30k_dir, "--strategy", "multi_worker", *args)
    outputs = finish(start_job(("chief", "worker", "worker"), command))
    assert "training ended at step 4 of 4" in outputs["chief:0"]
    run = Run(str(model_dir))
    steps = [(r["event"], r["step"]) for r in run.read_metrics()]
    assert len(steps) == len(set(steps)) and ("train", 4) in steps  # once each
    assert [p.rsplit("-", 1)[1] for p in run.checkpoints()] == ["2", "4"]
    assert sorted(os.listdir(model_dir)) == sorted(
        ["best", "checkpoints", "config.json", "logs", "metrics.jsonl", "spm.model"]
    )


PREEMPT = ["--strategy", "multi_worker", "--train-steps", "30", "--steps-per-epoch", "30",
           "--checkpoint-every", "1000", "--eval-every", "1000", "--log-every", "1",
           "--warmup-steps", "10", "--eval-sentences", "4"]  # fmt: skip


def wait_for_step(model_dir, step, tasks, timeout=600):
    """Block until the chief logged `step` in metrics.jsonl (every worker is there +-1)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(proc.poll() is not None for _, proc in tasks):
            raise AssertionError("a worker exited before the signal")
        logged = [r["step"] for r in Run(str(model_dir)).read_metrics() if r["event"] == "train"]
        if logged and logged[-1] >= step:
            return logged[-1]
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached within {timeout} s")


@pytest.mark.slow
def test_sigterm_to_one_worker_saves_everywhere_at_one_step_and_resumes_exactly(
    tmp_path, multi30k_dir
):
    """Two local workers; SIGTERM to worker 1 once the chief logged step 3: both workers
    stop after the same batch with status 143, the chief's checkpoint at that step (and no
    other: --checkpoint-every is larger than the run); started again, the job ends with
    the weights of the job left alone (dropout on: the RNG states are in the checkpoint)."""
    alone, preempted = tmp_path / "alone", tmp_path / "preempted"
    finish(start_job(("worker", "worker"), train_cmd(alone, multi30k_dir, *PREEMPT)))

    tasks = start_job(("worker", "worker"), train_cmd(preempted, multi30k_dir, *PREEMPT))
    wait_for_step(preempted, 3, tasks)
    tasks[1][1].send_signal(signal.SIGTERM)
    outputs = finish(tasks, codes=(143,))
    batches = {re.search(r"after batch (\d+)", out).group(1) for out in outputs.values()}
    assert len(batches) == 1  # the same batch on both workers
    (batch,) = batches
    saved = Run(str(preempted)).checkpoints()
    assert [p.rsplit("-", 1)[1] for p in saved] == [batch]  # float32: one update a batch
    assert 3 < int(batch) < 30

    outputs = finish(start_job(("worker", "worker"), train_cmd(preempted, multi30k_dir, *PREEMPT)))
    assert all(f"at step {batch}" in out for out in outputs.values())
    final = [Run(str(d)).checkpoints()[-1] for d in (alone, preempted)]
    assert all(path.endswith("ckpt-30") for path in final)
    assert_same_variables(final[0], final[1], tolerance=1e-4)
    assert not [p for p in os.listdir(preempted) if p.startswith("worker")]


@pytest.mark.slow
def test_multi_worker_two_processes(tmp_path, mini_multi30k_dir):
    """Two local workers: the non-chief waits for the chief's tokenizer, and early stopping
    on patience stops both at the same step (a chief-only decision would leave worker 1
    blocked in a collective). Only the chief writes: no worker_1 directory, no dead
    checkpoints. Each worker reads its own share of the pairs (pairs w, w + 2, ...) and
    translates its share of the validation sentences; both log the same BLEU."""
    model_dir = tmp_path / "mw"
    args = ["--train-steps", "12", "--steps-per-epoch", "6", "--checkpoint-every", "3",
            "--eval-every", "3", "--patience", "1"]  # fmt: skip
    outputs = run_workers(model_dir, mini_multi30k_dir, *args)
    assert "early stopping" in outputs[0]
    for w, out in enumerate(outputs):
        assert f"worker input: pairs {w}, {w} + 2, ... of every pass (share {w + 1} of 2)" in out
        share = f"sentences {w}, {w} + 2, ... of 8 (share {w + 1} of 2, 4 sentences)"
        assert f"validation BLEU: {share}" in out
    # each worker translated its half; both log the BLEU of the whole set (the summed
    # statistics: the 8 references' length), the one the chief records
    found = [re.findall(r"step (\d+): validation BLEU (\S+) \(.*/(\d+)\)", o) for o in outputs]
    records = [r for r in Run(str(model_dir)).read_metrics() if r["event"] == "bleu"]
    length = reference_length(mini_multi30k_dir, 8)
    assert (
        found[0] == found[1] == [(str(r["step"]), f"{r['val_bleu']:.2f}", length) for r in records]
    )
    assert found[0]
    assert not os.path.exists(model_dir / "worker_1")  # the chief's tokenizer is used
    stop = int(Run(str(model_dir)).checkpoints()[-1].rsplit("-", 1)[1])
    assert stop < 12


def reference_length(data_dir, count):
    """sacreBLEU's reference length of the first `count` validation references (German), as
    a string."""
    with gzip.open(os.path.join(data_dir, "val.de.gz"), "rt", encoding="utf-8") as handle:
        references = [line.rstrip("\n") for _, line in zip(range(count), handle)]
    return str(sacrebleu.corpus_bleu(references, [references]).ref_len)
