"""Every command's bad inputs, one table: exit 2, one line naming the thing, no traceback,
no file of an earlier run changed (the contract in tests/cli_contract.py)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.cli_contract import (
    ROOT,
    Case,
    assert_clean_failure,
    assert_unchanged,
    run_command,
    snapshot,
)
from tests.run_fixture import make_run


def write(relative: str, text: str):
    """A setup step: writes `text` to `{tmp}/relative`."""

    def setup(tmp):
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    return setup


def write_files(files: dict):
    """A setup step: writes each `{tmp}/relative` of `files`."""

    def setup(tmp):
        for relative, text in files.items():
            write(relative, text)(tmp)

    return setup


TWO_LINES_ONE_PREFIX = write_files({"in.txt": "A dog.\nA cat.\n", "prefix.txt": "Ein\n"})


def other_model(run_dir, **training):
    """The run's config.json describes another model (a wider one) than its checkpoint, as
    after an upgrade that changed the layout, with complete training settings (`training`
    overrides some)."""
    from keras_transformer.settings.args import TrainArgs

    config = json.loads((run_dir / "config.json").read_text())
    config["model"]["d_model"] = 32
    config["training"] = dataclasses.asdict(
        TrainArgs(
            preset="tiny", vocab_size=config["model"]["vocab_size"], batch_tokens=512,
            train_steps=10, steps_per_epoch=5, checkpoint_every=5, eval_every=5,
            eval_sentences=4, warmup_steps=10, lr_scale=1.0, dropout_rate=0.1,
            label_smoothing=0.1, precision="float32", **training,
        )
    )  # fmt: skip
    (run_dir / "config.json").write_text(json.dumps(config))


def with_training(run_dir, **settings):
    """The run's config.json with these training settings (e.g. a run trained with EMA)."""
    config = json.loads((run_dir / "config.json").read_text())
    config["training"] = {**config.get("training", {}), **settings}
    (run_dir / "config.json").write_text(json.dumps(config))


def tfds_with_a_shard_missing(tmp):
    """The test TFDS dataset prepared in {tmp}/tfds, its training shard deleted (a copy that
    stopped half-way)."""
    from tests.data import tfds_fixture

    tfds_fixture.prepare(str(tmp / "tfds"))
    (shard,) = (tmp / "tfds").rglob("*-train.tfrecord-*")
    shard.unlink()


def export_before_the_vector_signatures(tmp):
    """A SavedModel with only `serving_default`, as exports made before `sample` and
    `translate_with_options` were added."""
    import tensorflow as tf

    module = tf.Module()
    module.f = tf.function(
        lambda inputs: {"outputs": inputs, "scores": tf.zeros(tf.shape(inputs))},
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp / "old"), signatures={"serving_default": module.f})
    (tmp / "in.txt").write_text("A dog.\n")


CASES = [
    # ---- train.py
    Case(
        "train-negative-steps",
        ("train.py", "--model-dir", "{tmp}/new", "--train-steps", "-3"),
        ("--train-steps", "-3"),
    ),
    Case(
        "train-model-dir-under-a-file",
        ("train.py", "--model-dir", "{tmp}/afile/run", "--data-dir", "{data}"),
        ("--model-dir {tmp}/afile/run", "{tmp}/afile is a file"),
        setup=write("afile", "not a directory"),
    ),
    Case(
        "train-model-dir-is-a-file",
        ("train.py", "--model-dir", "{tmp}/afile", "--data-dir", "{data}"),
        ("--model-dir {tmp}/afile is a file",),
        setup=write("afile", "not a directory"),
    ),
    Case(
        "train-missing-files",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "files"),
        ("--dataset files", "--train-src", "--train-tgt"),
    ),
    Case(
        "train-small-corpus-automatic-vocabulary",
        (
            "train.py",
            "--model-dir",
            "{tmp}/new",
            "--dataset",
            "files",
            "--preset",
            "tiny",
            "--train-src",
            "{tmp}/s.en",
            "--train-tgt",
            "{tmp}/s.de",
            "--valid-src",
            "{tmp}/s.en",
            "--valid-tgt",
            "{tmp}/s.de",
        ),
        ("the automatic --vocab-size 8000", "60 pairs", "pass --vocab-size"),
        setup=lambda tmp: (
            write("s.en", "".join(f"a small cat number {i}\n" for i in range(60)))(tmp),
            write("s.de", "".join(f"eine kleine Katze Nummer {i}\n" for i in range(60)))(tmp),
        ),
    ),
    Case(
        "train-resume-checkpoint-of-another-model",
        ("train.py", "--model-dir", "{run}", "--data-dir", "{data}", "--preset", "tiny"),
        ("{run}/checkpoints/ckpt-5", "does not match", "new --model-dir"),
        setup=lambda tmp: other_model(tmp / "run"),
    ),
    Case(
        "train-corrupt-config",
        ("train.py", "--model-dir", "{run}", "--data-dir", "{data}"),
        ("{run}/config.json", "not valid JSON"),
        setup=write("run/config.json", '{"model": {"vocab_size": 6'),
    ),
    Case(
        "train-unknown-tfds-dataset",
        (
            "train.py",
            "--model-dir",
            "{tmp}/new",
            "--dataset",
            "tfds:no_such_dataset",
            "--data-dir",
            "{tmp}",
        ),
        ("unknown TFDS dataset 'no_such_dataset'",),
    ),
    Case(
        "train-tfds-unknown-config",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "tfds:wmt14_translate/xx-yy",
         "--data-dir", "{tmp}"),
        ("unknown TFDS dataset 'wmt14_translate/xx-yy'", "xx-yy not found"),
    ),
    Case(
        "train-tfds-shard-missing",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "tfds:kt_tiny_translate",
         "--src-lang", "en", "--tgt-lang", "de", "--data-dir", "{tmp}/tfds"),
        ("kt_tiny_translate is missing 1 of the 1 shard files", "'train'", "copy"),
        setup=tfds_with_a_shard_missing,
    ),
    Case(
        "train-tfds-not-prepared",
        (
            "train.py",
            "--model-dir",
            "{tmp}/new",
            "--dataset",
            "tfds:wmt14_translate/de-en",
            "--data-dir",
            "{tmp}/empty",
        ),
        (
            "wmt14_translate/de-en is not prepared in {tmp}/empty",
            "downloads/manual",
            "--tfds-download",
        ),
    ),
    Case(
        "train-collective-timeout",
        ("train.py", "--model-dir", "{tmp}/new", "--collective-timeout", "-5"),
        ("--collective-timeout", "-5"),
    ),
    Case(
        "train-loss-scale-without-float16",
        ("train.py", "--model-dir", "{tmp}/new", "--initial-loss-scale", "1024"),
        ("--initial-loss-scale", "--precision mixed_float16"),
    ),
    # several training corpora, subword regularization
    Case(
        "train-corpora-target-list-shorter",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "files",
         "--train-src", "{tmp}/a.en,{tmp}/b.en", "--train-tgt", "{tmp}/a.de"),
        ("--train-tgt lists 1 files and --train-src 2",),
    ),
    Case(
        "train-corpora-weights-count",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "files",
         "--train-src", "{tmp}/a.en,{tmp}/b.en", "--train-tgt", "{tmp}/a.de,{tmp}/b.de",
         "--train-weights", "3,1,1"),
        ("--train-weights has 3 weights for 2 training corpora",),
    ),
    Case(
        "train-corpora-weight-not-positive",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "multi30k,files",
         "--train-src", "{tmp}/a.en", "--train-tgt", "{tmp}/a.de", "--train-weights", "1,-2"),
        ("--train-weights", "'-2' is not a positive number"),
    ),
    Case(
        "train-corpora-weight-not-a-number",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "multi30k,files",
         "--train-src", "{tmp}/a.en", "--train-tgt", "{tmp}/a.de", "--train-weights", "1,x"),
        ("--train-weights", "'x' is not a positive number"),
    ),
    Case(
        "train-corpora-weights-for-one-corpus",
        ("train.py", "--model-dir", "{tmp}/new", "--train-weights", "2"),
        ("--train-weights needs several training corpora",),
    ),
    Case(
        "train-corpora-tag-out-of-range",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "multi30k,files",
         "--train-src", "{tmp}/a.en", "--train-tgt", "{tmp}/a.de", "--tag-corpus", "3"),
        ("--tag-corpus", "'3'", "2 training corpora"),
    ),
    Case(
        "train-corpora-files-twice",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "files,files"),
        ("--dataset 'files,files' lists files twice",),
    ),
    Case(
        "train-corpora-empty-item",
        ("train.py", "--model-dir", "{tmp}/new", "--dataset", "multi30k,"),
        ("--dataset 'multi30k,' has an empty item",),
    ),
    Case(
        "train-corpora-second-file-missing",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--dataset",
         "multi30k,files", "--train-src", "{tmp}/a.en", "--train-tgt", "{tmp}/no.de"),
        ("file not found", "{tmp}/no.de"),
        setup=write("a.en", "A dog.\n"),
    ),
    Case(
        "train-subword-alpha-negative",
        ("train.py", "--model-dir", "{tmp}/new", "--subword-alpha", "-0.1"),
        ("--subword-alpha must be >= 0", "-0.1"),
    ),
    Case(
        "train-subword-alpha-bpe-probability",
        ("train.py", "--model-dir", "{tmp}/new", "--subword-alpha", "1.5"),
        ("--subword-alpha 1.5", "--spm-model-type bpe", "[0, 1)"),
    ),
    Case(
        "train-tag-without-tag-symbol-on-resume",
        ("train.py", "--model-dir", "{run}", "--data-dir", "{data}", "--preset", "tiny",
         "--dataset", "multi30k,files", "--train-src", "{tmp}/a.en", "--train-tgt",
         "{tmp}/a.de", "--tag-corpus", "2"),
        ("--tag-corpus 2", "no <BT> symbol", "new --model-dir"),
        setup=lambda tmp: (
            write_files({"a.en": "A dog.\n", "a.de": "Ein Hund.\n"})(tmp),
            other_model(tmp / "run", dataset="multi30k,files", tag_corpus="2"),
        ),
    ),
    Case(
        "train-init-from-changes-the-model",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--init-from", "{run}",
         "--preset", "base"),
        ("--preset base", "--init-from {run}", "tiny", "drop --preset"),
    ),  # fmt: skip
    Case(
        "train-init-from-without-best",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--init-from", "{run}",
         "--max-length", "32"),
        ("--init-from {run}", "best/", "--init-average-last", "--init-checkpoint"),
    ),
    Case(
        "train-init-from-max-length-beyond-the-model",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--init-from", "{run}",
         "--max-length", "100"),
        ("--max-length 100", "64 positions", "--init-from {run}"),
    ),  # fmt: skip
    Case(
        "train-init-from-not-a-run",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--init-from",
         "{tmp}/nothing"),
        ("--init-from {tmp}/nothing", "config.json"),
    ),  # fmt: skip
    Case(
        "train-init-checkpoint-unreadable",
        ("train.py", "--model-dir", "{tmp}/new", "--data-dir", "{data}", "--init-from", "{run}",
         "--max-length", "32", "--init-checkpoint", "{run}/checkpoints/ckpt-99"),
        ("--init-checkpoint {run}/checkpoints/ckpt-99", "not a readable checkpoint"),
    ),  # fmt: skip
    Case(
        "train-init-checkpoint-without-init-from",
        ("train.py", "--model-dir", "{tmp}/new", "--init-checkpoint", "{run}/checkpoints/ckpt-30"),
        ("--init-checkpoint", "--init-from"),
    ),
    Case(
        "train-ema-decay-out-of-range",
        ("train.py", "--model-dir", "{tmp}/new", "--ema-decay", "1.5"),
        ("--ema-decay", "1.5", "(0, 1)"),
    ),
    Case(
        "train-resume-changes-ema-decay",
        ("train.py", "--model-dir", "{run}", "--data-dir", "{data}", "--ema-decay", "0.99"),
        ("--ema-decay 0.99", "0.9", "{run}/config.json"),
        setup=lambda tmp: with_training(tmp / "run", ema_decay=0.9),
    ),
    # kt-train --config FILE: the file, the key and what was expected
    Case(
        "train-config-missing-file",
        ("train.py", "--config", "{tmp}/nowhere.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/nowhere.yaml", "no such file", "recipes/multi30k-small.yaml"),
    ),
    Case(
        "train-config-unknown-key",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/r.yaml", "unknown key 'batch_token'", "did you mean batch_tokens"),
        setup=write("r.yaml", "preset: tiny\nbatch_token: 512\n"),
    ),
    Case(
        "train-config-wrong-type",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/r.yaml", "train_steps", "expected an integer, got 'many'"),
        setup=write("r.yaml", "preset: tiny\ntrain_steps: many\n"),
    ),
    Case(
        "train-config-not-a-choice",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/r.yaml", "precision", "expected one of float32, mixed_float16"),
        setup=write("r.yaml", "precision: float16\n"),
    ),
    Case(
        "train-config-bad-yaml",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/r.yaml", "line 3", "not valid YAML"),
        setup=write("r.yaml", "preset: tiny\nvocab_size: 500\n  train_steps: 10\n"),
    ),
    Case(
        "train-config-not-a-mapping",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--config {tmp}/r.yaml", "expected a mapping of flag names to values", "list"),
        setup=write("r.yaml", "- preset: tiny\n"),
    ),
    Case(
        "train-config-value-checked-as-a-flag",
        ("train.py", "--config", "{tmp}/r.yaml", "--model-dir", "{tmp}/new"),
        ("--warmup-steps must be a positive integer, got 0",),
        setup=write("r.yaml", "warmup_steps: 0\n"),
    ),
    # ---- export.py
    Case(
        "export-bad-beam",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--beam-size", "0"),
        ("--beam-size", "0"),
    ),
    Case(
        "export-no-run",
        ("export.py", "--model-dir", "{tmp}/nothing", "--export-dir", "{tmp}/e"),
        ("config.json not found",),
    ),
    Case(
        "export-dir-is-a-file",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/afile"),
        ("--export-dir", "{tmp}/afile"),
        setup=write("afile", "not a directory"),
    ),
    Case(
        "export-dir-under-a-file",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/afile/exports"),
        ("--export-dir {tmp}/afile/exports", "{tmp}/afile is a file"),
        setup=write("afile", "not a directory"),
    ),
    Case(
        "export-corrupt-config",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e"),
        ("config.json", "not valid JSON"),
        setup=write("run/config.json", '{"model": {"vocab_size": 6'),
    ),
    Case(
        "export-best-raw-weights-of-an-ema-run",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--best", "--no-ema"),
        ("--best --no-ema", "{run}/best", "drop --best"),
        setup=lambda tmp: with_training(tmp / "run", ema_decay=0.9),
    ),
    Case(
        "export-bad-attention-layer",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--attention-layer", "7"),
        ("--attention-layer", "7"),
    ),
    Case(
        "export-negative-min-length",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--min-length", "-1"),
        ("--min-length", "-1"),
    ),
    Case(
        "export-xla-max-batch-zero",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--xla",
         "--xla-max-batch", "0"),
        ("--xla-max-batch", "0"),
    ),  # fmt: skip
    Case(
        "export-xla-with-ctranslate2",
        ("export.py", "--model-dir", "{run}", "--export-dir", "{tmp}/e", "--xla",
         "--format", "ctranslate2"),
        ("--xla", "--format ctranslate2", "drop --xla"),
    ),  # fmt: skip
    # ---- translate / evaluate / score
    Case(
        "translate-missing-input",
        (
            "-m",
            "keras_transformer.cli.translate",
            "--model",
            "{export}",
            "--input",
            "{tmp}/no.txt",
        ),
        ("no.txt",),
    ),
    Case(
        "translate-output-folder-missing",
        ("-m", "keras_transformer.cli.translate", "--model", "{export}",
         "--input", "{tmp}/in.txt", "--output", "{tmp}/no/out.txt"),
        ("--output", "{tmp}/no/out.txt"),
        setup=write("in.txt", "A dog.\n"),
    ),
    Case(
        "translate-bad-temperature",
        ("-m", "keras_transformer.cli.translate", "--model", "{export}",
         "--input", "{tmp}/in.txt", "--temperature", "0"),
        ("--temperature", "0"),
        setup=write("in.txt", "A dog.\n"),
    ),
    Case(
        "translate-prefix-file-length",
        ("-m", "keras_transformer.cli.translate", "--model", "{export}",
         "--input", "{tmp}/in.txt", "--prefix-file", "{tmp}/prefix.txt"),
        ("--prefix-file", "prefix.txt"),
        setup=TWO_LINES_ONE_PREFIX,
    ),
    Case(
        "evaluate-output-is-a-directory",
        ("-m", "keras_transformer.cli.evaluate", "--model", "{export}",
         "--src", "{tmp}/in.txt", "--ref", "{tmp}/in.txt", "--output", "{tmp}"),
        ("--output", "is a directory"),
        setup=write("in.txt", "A dog.\n"),
    ),
    Case(
        "translate-seed-with-an-export-without-sample",
        ("-m", "keras_transformer.cli.translate", "--model", "{tmp}/old", "--input",
         "{tmp}/in.txt", "--seed", "1"),
        ("{tmp}/old", "no 'sample' signature", "re-export with this version"),
        setup=export_before_the_vector_signatures,
    ),
    Case(
        "evaluate-beam-size-with-an-export-without-options",
        ("-m", "keras_transformer.cli.evaluate", "--model", "{tmp}/old", "--src",
         "{tmp}/in.txt", "--ref", "{tmp}/in.txt", "--beam-size", "2"),
        ("no 'translate_with_options' signature", "re-export with this version"),
        setup=export_before_the_vector_signatures,
    ),
    Case(
        "evaluate-empty-files",
        ("-m", "keras_transformer.cli.evaluate", "--model", "{export}",
         "--src", "{tmp}/empty.txt", "--ref", "{tmp}/empty.txt"),
        ("--src {tmp}/empty.txt is empty",),
        setup=write("empty.txt", ""),
    ),
    Case(
        "evaluate-empty-stdin-gz",
        ("-m", "keras_transformer.cli.evaluate", "--model", "{export}", "--src", "-",
         "--ref", "{tmp}/empty.txt"),
        ("--src - is empty",),
        setup=write("empty.txt", ""),
        stdin=gzip.compress(b""),
    ),
    Case(
        "translate-cut-gzip-on-stdin",
        ("-m", "keras_transformer.cli.translate", "--model", "{export}"),
        ("stdin is not a complete gzip file",),
        stdin=gzip.compress(b"A dog.\n" * 50)[:25],
    ),
    Case(
        "score-line-counts-differ",
        ("-m", "keras_transformer.cli.score", "--model", "{export}",
         "--src", "{tmp}/in.txt", "--tgt", "{tmp}/prefix.txt"),
        ("prefix.txt", "in.txt"),
        setup=TWO_LINES_ONE_PREFIX,
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, multi30k_dir):
    """A small trained run and its export, made once; each case gets its own copy of the run
    (the tiny preset's 2 layers: train-init-from-changes-the-model names the preset that
    the model's sizes match)."""
    from keras_transformer.inference.export import export_run

    base = tmp_path_factory.mktemp("cli")
    run = make_run(str(base / "run"), multi30k_dir, steps=5)
    export = export_run(run, str(base / "exports"), model_name="m", max_extra_length=5)
    return run, export


def command_name(argv) -> str:
    """`python -m keras_transformer.cli.translate` is `kt-translate`; `python train.py` is
    `train.py`."""
    return "kt-" + argv[1].rsplit(".", 1)[-1] if argv[0] == "-m" else argv[0]


# The cases that load TensorFlow, but for a few of each command (train-corrupt-config,
# export-no-run, translate-bad-temperature) that keep a process of their own: they run in
# children forked from one process that imported TensorFlow once (tests/cli_driver.py), each
# still `python <argv>` with its own stdin, stderr and exit status. The cases that fail before
# TensorFlow loads take 0.2 s as processes of their own and stay so.
ONE_PROCESS = {
    "train-small-corpus-automatic-vocabulary",
    "train-resume-checkpoint-of-another-model", "train-unknown-tfds-dataset",
    "train-tfds-unknown-config", "train-tfds-shard-missing", "train-tfds-not-prepared",
    "train-corpora-second-file-missing", "train-tag-without-tag-symbol-on-resume",
    "train-init-from-changes-the-model", "train-init-from-without-best",
    "train-init-from-max-length-beyond-the-model", "train-init-from-not-a-run",
    "train-init-checkpoint-unreadable", "train-resume-changes-ema-decay",
    "export-bad-beam", "export-dir-is-a-file", "export-dir-under-a-file",
    "export-corrupt-config", "export-best-raw-weights-of-an-ema-run",
    "export-bad-attention-layer", "export-negative-min-length", "export-xla-max-batch-zero",
    "export-xla-with-ctranslate2", "translate-seed-with-an-export-without-sample",
    "evaluate-beam-size-with-an-export-without-options",
}  # fmt: skip


def prepare(case, run, export, tmp, multi30k_dir):
    """The case's folder `tmp` (a copy of the run, its setup), its filled-in argv and names,
    and the snapshot of the files it must leave unchanged."""
    shutil.copytree(run, tmp / "run")
    if case.setup:
        case.setup(tmp)
    fill = {"tmp": str(tmp), "run": str(tmp / "run"), "export": export, "data": multi30k_dir}
    argv = [arg.format(**fill) for arg in case.argv]
    names = [n.format(**fill) for n in case.names]
    return argv, names, snapshot(tmp, export)


@pytest.fixture(scope="module")
def one_process(trained, tmp_path_factory, multi30k_dir):
    """{case id: (completed process, argv, names, files before, files after)} of the
    ONE_PROCESS cases, run by one tests/cli_driver.py (files after: as the case ended)."""
    run, export = trained
    base = tmp_path_factory.mktemp("one_process")
    cases = [case for case in CASES if case.id in ONE_PROCESS]
    assert {case.id for case in cases} == ONE_PROCESS
    jobs, prepared = [], []
    for case in cases:
        tmp = base / case.id
        tmp.mkdir()
        argv, names, before = prepare(case, run, export, tmp, multi30k_dir)
        stdin = None
        if case.stdin is not None:
            stdin = str(base / f"{case.id}.stdin")
            (base / f"{case.id}.stdin").write_bytes(case.stdin)
        env = {**os.environ, **dict(case.env)}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        jobs.append(dict(argv=argv, stdin=stdin, env=env, cwd=str(ROOT), watch=[str(tmp), export]))
        prepared.append((argv, names, before))
    (base / "jobs.json").write_text(json.dumps(jobs))
    driver = run_command(
        ["-m", "tests.cli_driver", str(base / "jobs.json"), str(base / "out.json")]
    )
    assert driver.returncode == 0, driver.stderr.decode("utf-8", "replace")[-3000:]
    results = json.loads((base / "out.json").read_text())
    out = {}
    for case, (argv, names, before), result in zip(cases, prepared, results, strict=True):
        done = subprocess.CompletedProcess(
            argv, result["returncode"], b"", result["stderr"].encode("utf-8")
        )
        out[case.id] = (done, argv, names, before, result["after"])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_fails_in_one_line(case, trained, tmp_path, multi30k_dir, request):
    if case.id in ONE_PROCESS:
        out, argv, names, before, after = request.getfixturevalue("one_process")[case.id]
    else:
        run, export = trained
        argv, names, before = prepare(case, run, export, tmp_path, multi30k_dir)
        out = run_command(argv, stdin=case.stdin, env=dict(case.env))
        after = snapshot(tmp_path, export)
    assert_clean_failure(out, command_name(argv), names)
    assert_unchanged(before, after)


HELP_COMMANDS = [
    ("path", "train.py"),
    ("path", "export.py"),
    ("module", "keras_transformer.cli.train"),
    ("module", "keras_transformer.cli.export"),
    ("module", "keras_transformer.cli.translate"),
    ("module", "keras_transformer.cli.evaluate"),
    ("module", "keras_transformer.cli.score"),
]


@pytest.mark.parametrize("kind, target", HELP_COMMANDS, ids=[t for _, t in HELP_COMMANDS])
def test_help_answers_before_tensorflow_loads(kind, target):
    """--help (and so every flag error) comes before TensorFlow's 10-17 s import
    (train.py's own check is in tests/training/test_args.py)."""
    run = f"runpy.run_{kind}({target!r}, run_name='__main__')"
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{target!r}, '--help']\n"
        f"try:\n    {run}\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print('EXIT', code, 'tensorflow' in sys.modules)\n"
    )
    out = run_command(["-c", code])
    assert out.stdout.decode().strip().splitlines()[-1] == "EXIT 0 False", out.stderr[-2000:]


FLAG_ERRORS = [
    (("train.py", "--bogus", "1"), "train.py", ("unknown flag --bogus",)),
    (("train.py", "--preset", "huge"), "train.py", ("--preset", "'huge'")),
    (("-m", "keras_transformer.cli.train", "--train-steps", "x"), "kt-train", ("--train-steps",)),
    (("export.py", "--model-dir", "r"), "export.py", ("--export-dir",)),
    (("-m", "keras_transformer.cli.export", "--version", "v"), "kt-export", ("--version",)),
    (("-m", "keras_transformer.cli.translate"), "kt-translate", ("--model",)),
    (("-m", "keras_transformer.cli.evaluate", "--model", "m"), "kt-evaluate", ("--src", "--ref")),
    (("-m", "keras_transformer.cli.score", "--beam", "2"), "kt-score", ("--model",)),
]


@pytest.mark.parametrize("argv, command, names", FLAG_ERRORS, ids=[c for _, c, _ in FLAG_ERRORS])
def test_flag_errors_are_one_line_pointing_to_help(argv, command, names):
    """argparse's own errors (unknown flag, bad value, missing flag) keep the contract too:
    one line naming the flag and `<command> --help`, not the whole usage."""
    out = run_command(list(argv))
    line = assert_clean_failure(out, command, names)
    assert line.endswith(f"(see {command} --help)"), line


def next_steps(run: str, data_dir: str) -> list[str]:
    """The commands kt-train prints at the end of a Multi30k run in `run`, as printed."""
    import types

    import tensorflow as tf

    from keras_transformer.run_dir import Run
    from keras_transformer.settings.args import TrainSettings
    from keras_transformer.training.summary import summarize

    settings = TrainSettings(model_dir=run, data_dir=data_dir, train_steps=5)
    model = types.SimpleNamespace(optimizer=types.SimpleNamespace(iterations=tf.constant(5)))
    progress = types.SimpleNamespace(best=tf.constant(0.0), best_step=tf.constant(-1))
    bleu = types.SimpleNamespace(progress=progress, stopped_early=False, last_bleu=None)
    report = summarize(Run(run), settings, model, bleu)["report"]
    return [line.strip() for line in report.splitlines() if line.startswith("  kt-")]


@pytest.mark.slow
def test_the_next_steps_that_kt_train_prints_run_as_printed(trained, tmp_path, multi30k_dir):
    """The printed lines, run by a shell in a fresh directory with kt-* bound to this
    checkout: the export, then the test set's translation from a gzip file on stdin (one
    line out per line in, not the lines of its compressed bytes), then its BLEU. Each kt-*
    runs in a child forked from one process that imported TensorFlow once (tests/cli_driver.py
    --serve), with the shell's cwd, environment, stdin, stdout and stderr, and exits with the
    command's status."""
    run, _ = trained
    data = tmp_path / "data" / "multi30k"
    data.mkdir(parents=True)
    for lang in ("en", "de"):  # the test set's first 12 sentences
        with gzip.open(os.path.join(multi30k_dir, f"test_2016_flickr.{lang}.gz"), "rb") as f:
            head = b"".join(f.readlines()[:12])
        (data / f"test_2016_flickr.{lang}.gz").write_bytes(gzip.compress(head))
    steps = next_steps(run, str(data.parent))
    export, best, translate, evaluate = steps
    assert "--best" in best  # the run has no best/: the other way to export
    assert translate.endswith("test_2016_flickr.en.gz > translations.txt"), translate
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    server = os.path.join(tempfile.mkdtemp(prefix="kt-"), "socket")  # a short path
    client = ROOT / "tests" / "cli_client.py"
    for name in ("export", "translate", "evaluate"):
        shim = bin_dir / f"kt-{name}"
        shim.write_text(
            f'#!/bin/sh\nexec "{sys.executable}" -S "{client}" "{server}" '
            f'-m keras_transformer.cli.{name} "$@"\n'
        )
        shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    serving = subprocess.Popen(
        [sys.executable, "-m", "tests.cli_driver", "--serve", server], cwd=ROOT, env=env
    )
    outputs = []
    try:
        for line in (export, translate, evaluate):
            out = subprocess.run(
                ["sh", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=600
            )
            assert out.returncode == 0, f"{line}\n{out.stderr[-3000:]}"
            outputs.append(out)
    finally:
        serving.terminate()
        serving.wait()
        shutil.rmtree(os.path.dirname(server))
    assert "  weights: 1 checkpoint (step 5) of " in outputs[0].stdout, outputs[0].stdout
    assert "--average-last 5 asked for more: the run has 1" in outputs[0].stdout
    translations = (work / "translations.txt").read_text().splitlines()
    assert len(translations) == 12
    assert "were cut" not in outputs[1].stderr, outputs[1].stderr
    assert json.loads(outputs[2].stdout)["sentences"] == 12
