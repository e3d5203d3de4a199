import gzip
import os
import re
import subprocess

import pytest
import sacrebleu

from keras_transformer.run_dir import Run

# the helpers moved to trainer_runs; imported here too, where the cluster and preemption
# tests look for them
from tests.training.trainer_runs import (  # noqa: F401
    ROOT,
    assert_same_variables,
    run_workers,
    train_cmd,
)


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
    import re

    assert re.search(expected, out.stderr), out.stderr[-2000:]
