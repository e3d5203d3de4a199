"""kt-train started again on a run directory: the float16 loss scale carries over, and a flag
that would change the run is refused (training.trainer). On a Multi30k folder of 400 training
pairs (mini_multi30k_dir)."""

import pytest

from keras_transformer.run_dir import Run
from tests.training.trainer_runs import checkpoint_values, run_train


@pytest.mark.slow
def test_resume_restores_the_loss_scale(tmp_path, mini_multi30k_dir):
    """A start scale of 2**24 overflows float16 gradients: the first run halves it (skipping
    those batches) before its updates; the resumed run starts from the saved, lower scale
    and skips nothing. Restarted from 2**24, it would skip the same batches again."""
    model_dir = tmp_path / "fp16"
    args = ["--precision", "mixed_float16", "--initial-loss-scale", str(2**24)]
    args += ["--cpu-devices", "1"]  # float16 on the CPU, asked for explicitly
    args += ["--steps-per-epoch", "40", "--eval-every", "100"]
    run_train(model_dir, mini_multi30k_dir, "--train-steps", "2", *args)
    first = Run(str(model_dir)).checkpoints()[-1]
    saved, position = checkpoint_values(first, "dynamic_scale", "data_position")
    assert saved < 2**24 and position > 2  # overflows halved the scale, skipped batches
    out = run_train(model_dir, mini_multi30k_dir, "--train-steps", "4", *args)
    assert f"at step 2 (loss scale {saved:g})" in out.stdout
    last = Run(str(model_dir)).checkpoints()[-1]
    assert checkpoint_values(last, "dynamic_scale", "data_position") == [saved, position + 2]


@pytest.mark.slow
def test_resume_refuses_flags_that_would_change_the_run(tmp_path, mini_multi30k_dir):
    model_dir = tmp_path / "run"
    out = run_train(model_dir, mini_multi30k_dir, "--train-steps", "2", "--warmup-steps", "30")
    assert "settings (config.json):" in out.stdout  # logged at INFO, the default --log-level
    for flag, value, saved in (
        ("--warmup-steps", "50", "30"),
        ("--dropout-rate", "0.3", "0.2"),
        ("--precision", "mixed_float16", "float32"),
    ):
        out = run_train(
            model_dir, mini_multi30k_dir, "--train-steps", "4", flag, value, check=False
        )
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"{flag} {value} differs from {saved} in {model_dir}/config.json" in out.stderr
    # flags that only continue the run are fine; --log-level WARNING hides the INFO lines,
    # not the command's output (the summary)
    out = run_train(
        model_dir, mini_multi30k_dir, "--train-steps", "3", "--warmup-steps", "30",
        "--log-level", "WARNING",
    )  # fmt: skip
    assert "training ended at step 3 of 3" in out.stdout
    assert "settings (config.json):" not in out.stdout and "resumed from" not in out.stdout
