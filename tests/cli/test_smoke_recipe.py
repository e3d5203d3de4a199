"""recipes/smoke.yaml end to end, shortened: kt-train, kt-export on its run, kt-translate on the
export, as the README's smoke line runs them; the resolved checkpoint, BLEU and epoch intervals
fall inside the run (warmup keeps its floor: it shapes the weights)."""

from __future__ import annotations

import re

import pytest

from tests.training.small_corpus import run_commands

STEPS, EPOCH = 6, 4  # two epochs, the second one partial


def module(name: str, *argv: str) -> list[str]:
    return ["-m", f"keras_transformer.cli.{name}", *argv]


@pytest.mark.slow
def test_the_smoke_recipe_trains_exports_and_serves(tmp_path, multi30k_dir):
    run, exports = str(tmp_path / "smoke"), str(tmp_path / "exports")
    (tmp_path / "input.txt").write_text("A man rides a bike.\n", encoding="utf-8")
    # the three commands in order in one process tree (one import of TensorFlow), each as
    # `python -m` runs it; the agreement report on 8 validation sentences, not 200: its
    # wiring, not its figures
    train, export, out = run_commands(
        module("train", "--config", "recipes/smoke.yaml", "--model-dir", run,
               "--train-steps", str(STEPS), "--steps-per-epoch", str(EPOCH),
               "--eval-sentences", "4"),
        module("export", "--model-dir", run, "--export-dir", exports, "--model-name", "smoke",
               "--agreement-sentences", "8"),
        module("translate", "--model", f"{exports}/smoke/1"),
        env={"KT_DATA_DIR": multi30k_dir},
        stdins=[None, None, tmp_path / "input.txt"],
    )  # fmt: skip
    plan = train.stdout + train.stderr
    resolved = {
        flag: int(re.search(rf"--{flag} +(\d+)", plan).group(1))
        for flag in ("train-steps", "steps-per-epoch", "checkpoint-every", "eval-every")
    }  # fmt: skip
    assert resolved["train-steps"] == STEPS
    assert all(1 <= value <= STEPS for value in resolved.values()), resolved
    assert re.findall(r"^(\d+/\d+) - ", plan, re.M)[0] == "4/4"  # the first, whole epoch
    assert "of 8 outputs identical" in export.stdout, export.stdout
    assert len(out.stdout.splitlines()) == 1
