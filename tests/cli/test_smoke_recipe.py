"""recipes/smoke.yaml end to end, shortened: kt-train, kt-export on its run, kt-translate on the
export, as the README's smoke line runs them; the resolved checkpoint, BLEU and epoch intervals
fall inside the run (warmup keeps its floor: it shapes the weights)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS, EPOCH = 6, 4  # two epochs, the second one partial


def command(module: str, *argv: str, **kwargs) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", f"keras_transformer.cli.{module}", *argv],
        capture_output=True, text=True, cwd=ROOT, **kwargs,
    )  # fmt: skip
    assert out.returncode == 0, f"{module}: {out.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_the_smoke_recipe_trains_exports_and_serves(tmp_path, multi30k_dir):
    env = {**os.environ, "PYTHONPATH": ROOT, "KT_DATA_DIR": multi30k_dir}
    run, exports = str(tmp_path / "smoke"), str(tmp_path / "exports")
    train = command(
        "train", "--config", "recipes/smoke.yaml", "--model-dir", run,
        "--train-steps", str(STEPS), "--steps-per-epoch", str(EPOCH), "--eval-sentences", "4",
        env=env,
    )  # fmt: skip
    plan = train.stdout + train.stderr
    resolved = {
        flag: int(re.search(rf"--{flag} +(\d+)", plan).group(1))
        for flag in ("train-steps", "steps-per-epoch", "checkpoint-every", "eval-every")
    }  # fmt: skip
    assert resolved["train-steps"] == STEPS
    assert all(1 <= value <= STEPS for value in resolved.values()), resolved
    assert re.findall(r"^(\d+/\d+) - ", plan, re.M)[0] == "4/4"  # the first, whole epoch
    # the agreement report on 8 validation sentences, not 200: its wiring, not its figures
    export = command(
        "export", "--model-dir", run, "--export-dir", exports, "--model-name", "smoke",
        "--agreement-sentences", "8", env=env,
    )  # fmt: skip
    assert "of 8 outputs identical" in export.stdout, export.stdout
    out = command(
        "translate", "--model", os.path.join(exports, "smoke", "1"),
        input="A man rides a bike.\n", env=env,
    )  # fmt: skip
    assert len(out.stdout.splitlines()) == 1
