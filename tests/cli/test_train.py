"""kt-train --dry-run: the plan of a recipe file equals the plan of the same flags, and the
default recipe file is the default plan; nothing is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = os.path.join(ROOT, "recipes", "multi30k-small.yaml")

# three dry runs in one process (one TensorFlow import): each prints its plan between markers
PROBE = """
import contextlib, io, sys
from keras_transformer.cli import train
for argv in {runs!r}:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train.main(argv)
    print("=== EXIT", code)
    print(out.getvalue())
"""


def flags_of(recipe: str) -> list[str]:
    """The command-line flags equivalent to a recipe file."""
    with open(recipe, encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    flags = []
    for name, value in values.items():
        if value is not None:
            flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def test_a_recipe_files_dry_run_is_the_plan_of_its_flags(tmp_path, multi30k_dir):
    model_dir = str(tmp_path / "run")
    where = ["--model-dir", model_dir]  # the recipe's own model_dir, overridden
    runs = [
        ["--config", RECIPE, "--dry-run", *where],
        [*flags_of(RECIPE), "--dry-run", *where],
        ["--dry-run", *where],
    ]
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(runs=runs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "KT_DATA_DIR": multi30k_dir},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    plans = [part.strip() for part in out.stdout.split("=== EXIT")[1:]]
    assert all(plan.startswith("0\n") for plan in plans), out.stdout[-3000:]
    from_file, from_flags, default = plans
    assert "train: " in from_file and "29000 pairs" in from_file
    assert "--vocab-size         8000\n" in from_file and "--train-steps        ?" in from_file
    assert from_file == from_flags
    # the default plan: the same values, marked as automatic where no flag set them
    assert "--vocab-size         8000  (auto)" in default
    assert "tokens per replica: 4096 per micro-batch, 4096 per update" in default

    def unmarked(plan):
        return re.sub(r"  \(auto\)$", "", plan, flags=re.MULTILINE)

    assert unmarked(default) == unmarked(from_file)
    assert not os.path.exists(model_dir)  # nothing written


def test_a_multi_worker_dry_run_answers_without_its_peers(tmp_path, multi30k_dir):
    """--dry-run --strategy multi_worker plans from TF_CONFIG alone: with its peer never
    started, it answers in seconds (it used to build the strategy and wait for the peer)."""
    import json
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    workers = [f"127.0.0.1:{port}" for port in ports]
    config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 0}}
    model_dir = str(tmp_path / "run")
    out = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli.train", "--dry-run",
         "--strategy", "multi_worker", "--model-dir", model_dir],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "KT_DATA_DIR": multi30k_dir,
             "TF_CONFIG": json.dumps(config)},
        timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"dry run: nothing trained, nothing written to {model_dir}" in out.stdout
    assert not os.path.exists(model_dir)


def test_a_dry_run_without_the_data_downloads_nothing_and_plans_for_a_large_corpus(tmp_path):
    """No data directory, an empty home and cache: the default (Multi30k) and the WMT recipe
    are previewed without downloading Multi30k or touching TFDS's folder, as the plan of a
    corpus of unknown size (the large-corpus recipe), and nothing of ours is written. Nor
    does TensorFlow's C++ runtime log on stderr (no --log-level debug, no TF_CPP_MIN_LOG_LEVEL)."""
    from keras_transformer.cli.common import RUNTIME_LOG

    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    runs = [
        ["--dry-run", "--model-dir", str(tmp_path / "run")],
        ["--config", os.path.join(ROOT, "recipes", "wmt14-base.yaml"), "--dry-run",
         "--model-dir", str(tmp_path / "run")],
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("KT_DATA_DIR", "KT_OFFLINE")}
    env.update(PYTHONPATH=ROOT, HOME=str(home), XDG_CACHE_HOME=str(cache))
    env.pop("TFDS_DATA_DIR", None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(runs=runs)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    multi30k, wmt = [part.strip() for part in out.stdout.split("=== EXIT")[1:]]
    assert multi30k.startswith("0\n")
    assert "\ntrain: not at hand (Multi30k file train.en(.gz) not found" in multi30k
    assert wmt.startswith("0\n")
    assert "\ntrain: not at hand (TFDS dataset wmt14_translate/de-en is not" in wmt
    # the WMT recipe's mixed_float16 on this GPU-less machine: said, not a stop
    assert "on this machine, kt-train would stop: --precision mixed_float16" in wmt
    for plan in (multi30k, wmt):
        assert "\ncorpus size unknown: the plan of a large corpus" in plan
        assert re.search(r"^  --vocab-size +37000", plan, re.MULTILINE), plan
    written = [str(p) for p in tmp_path.rglob("*")]
    assert not [p for p in written if "keras_transformer" in p or "tensorflow_datasets" in p]
    assert not (tmp_path / "run").exists()
    assert not [line for line in out.stderr.splitlines() if RUNTIME_LOG.match(line)], out.stderr


# dry runs in one process, stdout and stderr apart; `driver` stands in for an NVIDIA driver
DEVICE_PROBE = """
import contextlib, io
from keras_transformer.cli import train
from keras_transformer.training import strategy
for argv, driver in {runs!r}:
    strategy.nvidia_driver_present = lambda: driver
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train.main(argv)
    print("=== EXIT", code)
    print(err.getvalue() + "=== OUT")
    print(out.getvalue())
"""


def test_device_checks_stop_a_run_that_would_silently_use_the_cpu(tmp_path, multi30k_dir):
    """No GPU here: mixed_float16 stops in one line unless CPU devices were asked for
    (--cpu-devices, as the tests do); bfloat16 passes; a machine with an NVIDIA driver that
    TensorFlow cannot use stops naming the gpu extra; --strategy mirrored says it trains on
    the CPU; every start logs the device block."""
    where = ["--model-dir", str(tmp_path / "run"), "--dry-run"]
    start = ["--model-dir", str(tmp_path / "fresh")]  # stops before reading the data
    runs = [
        (["--precision", "mixed_float16", *start], False),
        (["--precision", "mixed_float16", "--cpu-devices", "1", *where], False),
        (["--precision", "mixed_bfloat16", *where], False),
        ([*start], True),
        (["--cpu-devices", "1", *where], True),
        (["--strategy", "mirrored", *where], False),
        (["--precision", "mixed_float16", *where], False),  # a preview says it, exit 0
    ]
    out = subprocess.run(
        [sys.executable, "-c", DEVICE_PROBE.format(runs=runs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "KT_DATA_DIR": multi30k_dir},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = []
    for part in out.stdout.split("=== EXIT ")[1:]:
        code, rest = part.split("\n", 1)
        err, stdout = rest.split("=== OUT\n", 1)
        results.append((int(code), err.strip(), stdout))
    assert [code for code, _, _ in results] == [2, 0, 0, 2, 0, 0, 0], out.stdout[-3000:]
    float16, _, _, driver, _, mirrored, preview = results
    assert "on this machine, kt-train would stop: --precision mixed_float16" in preview[2]
    assert not os.path.exists(tmp_path / "fresh" / "config.json")
    assert float16[1].count("\n") == 0 and float16[1].startswith("kt-train: error: ")
    assert "--precision mixed_float16" in float16[1] and "--cpu-devices" in float16[1]
    assert driver[1].count("\n") == 0 and 'pip install "keras-transformer-nmt[gpu]"' in driver[1]
    assert "no GPU visible, training on 1 CPU device" in mirrored[2]
    for code, _, stdout in results:
        if code == 0:
            assert "devices:" in stdout and "cuDNN" in stdout and "NCCL" in stdout
