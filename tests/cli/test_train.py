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
    runs = [
        (["--precision", "mixed_float16", *where], False),
        (["--precision", "mixed_float16", "--cpu-devices", "1", *where], False),
        (["--precision", "mixed_bfloat16", *where], False),
        ([*where], True),
        (["--cpu-devices", "1", *where], True),
        (["--strategy", "mirrored", *where], False),
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
    assert [code for code, _, _ in results] == [2, 0, 0, 2, 0, 0], out.stdout[-3000:]
    float16, _, _, driver, _, mirrored = results
    assert float16[1].count("\n") == 0 and float16[1].startswith("kt-train: error: ")
    assert "--precision mixed_float16" in float16[1] and "--cpu-devices" in float16[1]
    assert driver[1].count("\n") == 0 and 'pip install "keras-transformer-nmt[gpu]"' in driver[1]
    assert "no GPU visible, training on 1 CPU device" in mirrored[2]
    for code, _, stdout in results:
        if code == 0:
            assert "devices:" in stdout and "cuDNN" in stdout and "NCCL" in stdout
