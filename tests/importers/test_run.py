"""An imported run used as a trained one: fine-tuned with `kt-train --init-from`, exported,
and served as the OPUS-MT page (docs/opus-mt.md) says."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.training.small_corpus import ROOT, run_commands, write_corpus

STEPS = 100


def validation_nll(run_dir: str, data_dir: str) -> float:
    """Mean negative log-likelihood per target token (eos included) of the run's last
    checkpoint on the validation pairs, from the `score` of the translator."""
    from keras_transformer.inference.translator import Translator
    from keras_transformer.run_dir import Run

    src, tgt = (
        [line.strip() for line in open(os.path.join(data_dir, f"valid.{lang}"), encoding="utf-8")]
        for lang in ("en", "de")
    )
    model, tokenizer = Run(run_dir).load_model()
    translator = Translator(model, tokenizer)  # kept: its tf.function needs it alive
    out = translator.score(tf.constant(src), tf.constant(tgt))
    token_scores = out["token_scores"].numpy()
    mask = np.array([[bool(p) for p in row] for row in out["target_tokens"].numpy()])
    return float(-token_scores[mask].sum() / mask.sum())


@pytest.fixture(scope="module")
def tuned(marian, imported, multi30k_dir):
    """The imported run fine-tuned for STEPS updates on Multi30k train lines 0-600, with the
    automatic recipe (no --warmup-steps, no --lr-scale), and its export (kt-export as
    docs/opus-mt.md runs it), after train.py --dry-run of recipes/opus-mt-finetune.yaml on
    the imported run (test_the_fine_tuning_recipe_file_dry_runs): the three commands in one
    process tree (one import of TensorFlow). (run dir, data dir, export dir, the dry run's
    (model dir, CompletedProcess))."""
    root = marian[0]
    flags = write_corpus(os.path.join(root, "data"), multi30k_dir, 0, 600)
    run_dir, export_dir = os.path.join(root, "tuned"), os.path.join(root, "exported")
    dry_dir = os.path.join(root, "dry-run")
    dry_run, train, export = run_commands(
        [os.path.join(ROOT, "train.py"), "--config",
         os.path.join(ROOT, "recipes", "opus-mt-finetune.yaml"), "--init-from", imported,
         "--model-dir", dry_dir, "--dry-run"],
        [os.path.join(ROOT, "train.py"), "--model-dir", run_dir, "--init-from", imported,
         *flags, "--train-steps", str(STEPS), "--max-length", "64", "--batch-tokens", "1024",
         "--eval-sentences", "8", "--eval-beam-size", "1", "--verbose", "0", "--log-every", "50"],
        ["-m", "keras_transformer.cli.export", "--model-dir", run_dir, "--export-dir",
         export_dir, "--model-name", "opus-mt-tuned", "--average-last", "1"],
        check=False,
    )  # fmt: skip
    for out in (train, export):  # the dry run's exit: its test
        assert out.returncode == 0, out.stderr[-3000:]
    return run_dir, os.path.join(root, "data"), export_dir, (dry_dir, dry_run)


@pytest.mark.slow
def test_a_fine_tuned_import_keeps_its_model_and_tokenizers_and_lowers_its_loss(imported, tuned):
    from keras_transformer.settings.recipe import FINE_TUNE_PEAK_LR

    run_dir, data_dir, _, _ = tuned
    source, config = (json.load(open(os.path.join(d, "config.json"))) for d in (imported, run_dir))
    assert config["model"] == source["model"]  # the model's own options (decoder_layers, ...)
    assert config["model"]["decoder_start_zero"] and config["model"]["sinusoid_layout"] == "halves"
    for name in ("source.spm", "target.spm", "vocab.json"):  # the same tokenizers, byte for byte
        with open(os.path.join(imported, name), "rb") as a, open(os.path.join(run_dir, name), "rb") as b:  # fmt: skip
            assert a.read() == b.read(), name
    assert not os.path.exists(os.path.join(run_dir, "spm.model"))
    # the fine-tuning recipe: a short warmup to a peak of FINE_TUNE_PEAK_LR
    training, d_model = config["training"], config["model"]["d_model"]
    assert training["warmup_steps"] == 100
    peak = training["lr_scale"] / math.sqrt(d_model * training["warmup_steps"])
    assert peak == pytest.approx(FINE_TUNE_PEAK_LR, rel=1e-4)
    before, after = validation_nll(imported, data_dir), validation_nll(run_dir, data_dir)
    print(f"validation NLL per token: imported {before:.4f}, fine-tuned {after:.4f}")
    assert after < before - 0.01, (before, after)


@pytest.mark.slow
def test_a_fine_tuned_import_exports_and_translates(tuned):
    from keras_transformer.inference.translator import Translator
    from keras_transformer.run_dir import Run
    from tests.inference.test_export import documented_requests, tf_serving

    run_dir, _, export_dir, _ = tuned  # exported by the fixture, with the commands' exit 0
    sentences = ["A dog runs in the snow.", "Two men are talking."]
    body = {"signature_name": "serving_default", "inputs": {"inputs": sentences}}
    # with the requests of docs/opus-mt.md, as written: one server process answers all
    page = [b for where, b in documented_requests() if where == "docs/opus-mt.md"]
    assert len(page) == 2
    answer, first, second = tf_serving(
        os.path.join(export_dir, "opus-mt-tuned", "1"), [[body], *([b] for b in page)]
    )
    assert "error" not in answer, answer
    served = answer["results"][0]
    model, tokenizer = Run(run_dir).load_model()  # the last checkpoint, as exported
    translator = Translator(model, tokenizer)
    expected = translator(tf.constant(sentences))
    assert served["outputs"] == [t.decode() for t in expected["outputs"].numpy()]
    np.testing.assert_allclose(served["scores"], expected["scores"].numpy(), atol=1e-4)
    # the requests of docs/opus-mt.md, as written, get the answers' shapes it states
    assert len(first["results"][0]["outputs"]) == len(first["results"][0]["scores"]) == 2
    assert np.shape(second["results"][0]["outputs"]) == np.shape(second["results"][0]["scores"])
    assert np.shape(second["results"][0]["outputs"]) == (1, 2)


@pytest.mark.slow
def test_the_fine_tuning_recipe_file_dry_runs(tuned):
    """recipes/opus-mt-finetune.yaml parses and resolves, with the fine-tuning schedule,
    against an imported run (its init_from replaced); nothing is written."""
    model_dir, out = tuned[3]  # run by the fixture's process tree, before the fine-tuning
    assert out.returncode == 0, out.stderr[-3000:]
    assert not os.path.exists(model_dir)
    lines = [line.split() for line in out.stdout.splitlines() if line.startswith("  --")]
    flags = {words[0]: words[1] for words in lines if len(words) >= 2}
    steps, warmup = int(flags["--train-steps"]), int(flags["--warmup-steps"])
    assert warmup == min(1000, max(100, round(0.05 * steps, -2)))
    assert float(flags["--lr-scale"]) == pytest.approx(1e-4 * math.sqrt(32 * warmup), rel=1e-4)
