import json
import os

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.run_dir import Run, RunDirError, load_trained


def tiny_model(**overrides):
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=30, **overrides))
    model.build()
    return model


def test_average_of_checkpoints_is_the_mean_of_weights(tmp_path):
    run = Run(str(tmp_path))
    model = tiny_model()
    manager = run.checkpoint_manager(tf.train.Checkpoint(model=model))
    snapshots = []
    for step in (1, 2, 3):
        model.set_weights([w + step for w in model.get_weights()])
        snapshots.append(model.get_weights())
        manager.save(checkpoint_number=step)
    paths = run.checkpoints()
    assert [p.rsplit("-", 1)[1] for p in paths] == ["1", "2", "3"]
    run.restore_average(model, paths[-2:])
    for got, a, b in zip(model.get_weights(), snapshots[1], snapshots[2]):
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6)


def test_averaging_refuses_a_checkpoint_of_another_model(tmp_path):
    run = Run(str(tmp_path))
    small = tiny_model(num_layers=1)
    run.checkpoint_manager(tf.train.Checkpoint(model=small)).save(checkpoint_number=1)
    model = tiny_model()  # 2 layers: the checkpoint lacks layer_1
    before = model.get_weights()
    with pytest.raises(RunDirError, match=r"checkpoint .*ckpt-1 does not match the model"):
        run.restore_average(model, run.checkpoints())
    for a, b in zip(model.get_weights(), before):  # nothing half-restored was averaged in
        np.testing.assert_array_equal(a, b)


def test_half_written_or_deleted_checkpoints_are_ignored(tmp_path):
    run = Run(str(tmp_path))
    manager = run.checkpoint_manager(tf.train.Checkpoint(model=tiny_model()))
    manager.save(checkpoint_number=1)
    manager.save(checkpoint_number=2)
    # a save killed before its state-file update leaves files the state does not list
    with open(os.path.join(run.path("checkpoints"), "ckpt-3.data-00000-of-00001"), "wb") as f:
        f.write(b"partial")
    # a listed checkpoint whose index file is gone (deleted, or a copy that stopped half-way)
    os.remove(os.path.join(run.path("checkpoints"), "ckpt-2.index"))
    assert [p.rsplit("-", 1)[1] for p in run.checkpoints()] == ["1"]


def test_config_and_tokenizer_round_trip_atomically(tmp_path):
    run = Run(str(tmp_path / "run"))
    assert not run.exists
    run.write_config({"model": kt.TransformerConfig.preset("tiny").to_dict(), "training": {}})
    assert run.exists and run.read_run_config().model == kt.TransformerConfig.preset("tiny")
    assert not [n for n in os.listdir(run.model_dir) if n.endswith(".tmp")]
    run.append_metrics({"step": 1, "loss": 2.0})
    run.append_metrics({"step": 2, "loss": 1.5})
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    with open(run.path("config.json")) as handle:
        assert json.load(handle)["model"]["d_model"] == 64


def test_missing_pieces_are_named(tmp_path):
    with pytest.raises(RunDirError, match="config.json not found"):
        load_trained(str(tmp_path))
    run = Run(str(tmp_path))
    run.write_config({"model": kt.TransformerConfig.preset("tiny").to_dict(), "training": {}})
    with pytest.raises(RunDirError, match="spm.model not found"):
        run.load_model()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_atomic_writes_have_the_umasks_mode(tmp_path, umask):
    """config.json, a rewritten metrics.jsonl and any write_atomic file: 0666 less the
    umask, as `open` gives (mkstemp alone would leave them 0600)."""
    from keras_transformer.files import write_atomic

    mask = os.umask(umask)
    try:
        run = Run(str(tmp_path / "run"))
        run.write_config({"model": kt.TransformerConfig.preset("tiny").to_dict()})
        run.append_metrics({"step": 1})
        run.append_metrics({"step": 2})
        run.truncate_metrics(1)
        write_atomic(str(tmp_path / "note.txt"), "x")
    finally:
        os.umask(mask)
    for path in (run.path("config.json"), run.path("metrics.jsonl"), tmp_path / "note.txt"):
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask, path
    assert os.stat(run.model_dir).st_mode & 0o777 == 0o777 & ~umask


def test_a_run_directory_on_another_gfile_file_system():
    """--model-dir goes through tf.io.gfile (gs://, hdfs://, ...): here TensorFlow's
    in-memory ram:// file system, which Python's open() and os.path cannot see."""
    import uuid

    from keras_transformer.data.tokenizer import SubwordTokenizer, train_sentencepiece
    from keras_transformer.settings.args import ConfigError
    from keras_transformer.training.preparation import GAVE_UP, check_workers, wait_for

    run = Run(f"ram://kt-{uuid.uuid4().hex}/run")
    assert not run.exists
    run.write_config({"model": kt.TransformerConfig.preset("tiny").to_dict(), "training": {}})
    assert run.exists and run.read_run_config().model == kt.TransformerConfig.preset("tiny")
    assert not [n for n in tf.io.gfile.listdir(run.model_dir) if n.endswith(".tmp")]
    words = [f"w{i} w{i * 7 % 13} w{i % 5}" for i in range(200)]
    tokenizer = SubwordTokenizer(train_sentencepiece(words, 280))
    run.save_tokenizer(tokenizer)
    assert run.load_tokenizer().proto == tokenizer.proto
    for step in (1, 2, 3):
        run.append_metrics({"step": step, "loss": 1.0 / step})
    assert [r["step"] for r in run.truncate_metrics(2)] == [1, 2]
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    model = kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=tokenizer.vocab_size))
    model.build()
    manager = run.checkpoint_manager(tf.train.Checkpoint(model=model))
    manager.save(checkpoint_number=7)
    # (restoring from ram:// fails on a quirk of that file system: it calls "ckpt-7" a
    # directory because files start with that name; gs:// and local paths restore)
    assert [p.rsplit("-", 1)[1] for p in run.checkpoints()] == ["7"]
    # a worker that gave up waiting for the chief leaves its note there too
    with pytest.raises(ConfigError, match="--worker-wait"):
        wait_for(run.path("never.json"), 0, run.path(GAVE_UP.format(1)))
    with pytest.raises(ConfigError, match="worker_1 gave up"):
        check_workers(run)
    assert not tf.io.gfile.glob(run.path(GAVE_UP.format("*")))


def test_create_writes_the_tokenizer_then_the_config_that_marks_the_run(tmp_path, monkeypatch):
    """`Run.create`: spm.model first, then config.json (the other workers of a job wait for
    config.json, so a run that `exists` always has its tokenizer)."""
    from keras_transformer.data.tokenizer import SubwordTokenizer, train_sentencepiece
    from keras_transformer.settings.run_config import RunConfig

    run = Run(str(tmp_path / "run"))
    words = [f"w{i} w{i * 7 % 13} w{i % 5}" for i in range(200)]
    tokenizer = SubwordTokenizer(train_sentencepiece(words, 280))
    config = RunConfig.of_import(kt.TransformerConfig.preset("tiny"), {"source": "test"})
    save = Run.save_tokenizer

    def save_before_config(self, tokenizer):
        assert not self.exists
        save(self, tokenizer)

    monkeypatch.setattr(Run, "save_tokenizer", save_before_config)
    run.create(config, tokenizer)
    assert run.exists and run.read_run_config() == config
    assert run.load_tokenizer().proto == tokenizer.proto


def test_a_torn_last_metrics_line_is_skipped_a_bad_line_elsewhere_named(tmp_path, caplog):
    """A kill during an append leaves the last line cut short (no newline): a resume reads
    the lines before it (with a warning) and its truncation drops it; a line that is not
    JSON anywhere else is damage, reported with the file and the line."""
    run = Run(str(tmp_path))
    for step in (1, 2):
        run.append_metrics({"event": "train", "step": step})
    with open(run.path("metrics.jsonl"), "a") as handle:
        handle.write('{"event": "train", "st')
    assert [r["step"] for r in run.read_metrics()] == [1, 2]
    assert "metrics.jsonl line 3 is incomplete" in caplog.text
    assert [r["step"] for r in run.truncate_metrics(2)] == [1, 2]
    run.append_metrics({"event": "train", "step": 3})
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    lines = open(run.path("metrics.jsonl")).read().splitlines()
    lines[1] = lines[1][:10]
    with open(run.path("metrics.jsonl"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=r"metrics\.jsonl line 2 is not a JSON object"):
        run.read_metrics()
