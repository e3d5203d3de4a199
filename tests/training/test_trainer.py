import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = [
    "--preset",
    "tiny",
    "--vocab-size",
    "500",
    "--max-length",
    "32",
    "--batch-tokens",
    "512",
    "--eval-sentences",
    "8",
    "--eval-beam-size",
    "1",
    "--verbose",
    "0",
    "--log-every",
    "5",
]


def train_cmd(model_dir, data_dir, *extra):
    return [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        "--data-dir",
        data_dir,
        "--model-dir",
        str(model_dir),
        *TINY,
        *extra,
    ]


def run_train(model_dir, data_dir, *extra, env=None, check=True):
    out = subprocess.run(
        train_cmd(model_dir, data_dir, *extra), capture_output=True, text=True, env=env, cwd=ROOT
    )
    if check and out.returncode != 0:
        raise AssertionError(out.stderr[-3000:])
    return out


def restored(model_dir, path):
    cfg = kt.TransformerConfig.from_dict(run_dir.read_config(model_dir)["model"])
    model = kt.Transformer(cfg)
    model.compile(
        optimizer=kt.paper_optimizer(cfg.d_model, 4000), loss=kt.LabelSmoothedCrossEntropy()
    )
    model.optimizer.build(model.trainable_variables)
    tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(path).expect_partial()
    return model


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path, multi30k_dir):
    model_dir = tmp_path / "run"
    args = ["--train-steps", "60", "--steps-per-epoch", "20", "--checkpoint-every", "10"]
    proc = subprocess.Popen(
        train_cmd(model_dir, multi30k_dir, *args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not run_dir.checkpoint_paths(str(model_dir)):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    paths = run_dir.checkpoint_paths(str(model_dir))
    assert paths, "no checkpoint before the kill"
    killed_at = int(paths[-1].rsplit("-", 1)[1])
    assert killed_at < 60
    model = restored(str(model_dir), paths[-1])
    assert int(model.optimizer.iterations.numpy()) == killed_at
    schedule = kt.WarmupSchedule(model.config.d_model, 4000)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(
        float(schedule(killed_at)), rel=1e-6
    )

    out = run_train(model_dir, multi30k_dir, *args)
    assert f"at step {killed_at}" in out.stdout
    final = run_dir.checkpoint_paths(str(model_dir))[-1]
    assert final.endswith("ckpt-60")
    assert int(restored(str(model_dir), final).optimizer.iterations.numpy()) == 60
    records = [json.loads(line) for line in open(model_dir / run_dir.METRICS_FILE)]
    assert {"step", "epoch", "loss"} <= set(records[0])
    assert any("val_bleu" in r for r in records) and any("val_loss" in r for r in records)
    assert os.listdir(model_dir / run_dir.LOG_DIR)  # TensorBoard logs
    # asking again for the same step count does nothing
    assert "already at step 60" in run_train(model_dir, multi30k_dir, *args).stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multi_worker_two_processes(tmp_path, multi30k_dir):
    model_dir = tmp_path / "mw"
    # one tokenizer for both workers
    run_train(tmp_path / "tok", multi30k_dir, "--train-steps", "1", "--eval-sentences", "1")
    os.makedirs(model_dir / "worker_1")
    for d in (model_dir, model_dir / "worker_1"):
        shutil.copy(tmp_path / "tok" / run_dir.TOKENIZER_FILE, d / run_dir.TOKENIZER_FILE)
    workers = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    procs = []
    for index in range(2):
        env = dict(
            os.environ,
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
        )
        procs.append(
            subprocess.Popen(
                train_cmd(
                    model_dir,
                    multi30k_dir,
                    "--strategy",
                    "multi_worker",
                    "--train-steps",
                    "6",
                    "--steps-per-epoch",
                    "6",
                    "--checkpoint-every",
                    "3",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
        )
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    chief = run_dir.checkpoint_paths(str(model_dir))[-1]
    other = run_dir.checkpoint_paths(str(model_dir / "worker_1"))[-1]
    assert chief.endswith("ckpt-6") and other.endswith("ckpt-6")
    a, b = tf.train.load_checkpoint(chief), tf.train.load_checkpoint(other)
    # every saved variable: weights (some stored under the optimizer's references) and slots
    names = [n for n, _ in tf.train.list_variables(chief) if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    assert len(names) > 100
    for name in names:
        np.testing.assert_array_equal(a.get_tensor(name), b.get_tensor(name))


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


@pytest.mark.parametrize(
    "case,expected",
    [
        ("mismatch", r"a\.en has 3 lines, .*b\.de has 2 lines"),
        ("missing", r"file not found: .*missing\.en"),
        ("no_multi30k", r"train\.en\(\.gz\) not found in: .*empty"),
        ("batch_tokens", r"--batch-tokens must be a positive integer, got 0"),
        ("max_length", r"--max-length must be a positive integer, got -5"),
        ("dataset", r"unknown --dataset 'wmt99'"),
    ],
)
def test_bad_input_gives_a_clear_message(tmp_path, case, expected, multi30k_dir):
    src = write(tmp_path / "a.en", ["one", "two", "three"])
    tgt = write(tmp_path / "b.de", ["eins", "zwei"])
    args = {
        "mismatch": [
            "--dataset",
            "files",
            "--train-src",
            src,
            "--train-tgt",
            tgt,
            "--valid-src",
            src,
            "--valid-tgt",
            tgt,
        ],
        "missing": [
            "--dataset",
            "files",
            "--train-src",
            str(tmp_path / "missing.en"),
            "--train-tgt",
            tgt,
            "--valid-src",
            src,
            "--valid-tgt",
            tgt,
        ],
        "no_multi30k": ["--data-dir", str(tmp_path / "empty")],
        "batch_tokens": ["--batch-tokens", "0"],
        "max_length": ["--max-length", "-5"],
        "dataset": ["--dataset", "wmt99"],
    }[case]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), KT_OFFLINE="1")
    out = subprocess.run(
        train_cmd(tmp_path / "run", multi30k_dir, *args),
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    import re

    assert re.search(expected, out.stderr), out.stderr[-2000:]
