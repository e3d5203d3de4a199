import os
import re
import subprocess

import pytest

from keras_transformer.run_dir import Run

# the helpers moved to trainer_runs; imported here too, where the cluster and preemption
# tests look for them
from tests.training.trainer_runs import (  # noqa: F401
    ROOT,
    assert_same_variables,
    run_workers,
    train_cmd,
)


def test_a_worker_that_gives_up_stops_the_chief(tmp_path):
    from keras_transformer.settings.args import ConfigError
    from keras_transformer.training.preparation import GAVE_UP, check_workers, wait_for

    run_dir = Run(str(tmp_path))
    check_workers(run_dir)  # nothing to report
    note = run_dir.path(GAVE_UP.format(1))
    with pytest.raises(ConfigError, match=r"waited 0 s \(--worker-wait\) for the chief"):
        wait_for(run_dir.path("config.json"), 0, note)
    assert os.path.isfile(note)
    with pytest.raises(ConfigError, match=r"worker_1 gave up waiting for this chief"):
        check_workers(run_dir)
    check_workers(run_dir)  # the note is cleared: the next start begins clean


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
        ("dropout", r"--dropout-rate must be in \[0, 1\), got 1\.5"),
        ("lr_scale", r"--lr-scale must be positive, got -1\.0"),
        ("steps", r"give --epochs or --train-steps, not both"),
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
        "dropout": ["--dropout-rate", "1.5"],
        "lr_scale": ["--lr-scale", "-1"],
        "steps": ["--epochs", "2", "--train-steps", "5"],
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
    assert re.search(expected, out.stderr), out.stderr[-2000:]
