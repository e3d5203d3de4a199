import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt

RNG = np.random.default_rng(5)
VOCAB = 40
SRC = np.array([[5, 9, 12, 7, 3, 0], [8, 6, 3, 0, 0, 0]], np.int32)
TGT = np.array([[2, 14, 15, 16, 17], [2, 20, 21, 0, 0]], np.int32)


def tiny(**overrides):
    return kt.Transformer(kt.TransformerConfig.preset("tiny", vocab_size=VOCAB, **overrides))


@pytest.mark.parametrize("name,expected", [("base", 63e6), ("big", 213e6)])
def test_paper_parameter_counts(name, expected):
    model = kt.Transformer(kt.TransformerConfig.preset(name, vocab_size=37000))
    model.build()
    assert abs(model.count_params() - expected) / expected < 0.01


def test_embedding_matrix_is_shared_three_ways():
    model = tiny()
    model.build()
    names = [w.path.split("/", 1)[1] for w in model.weights if "embedding" in w.path]
    assert names == ["embedding/embeddings"]  # one matrix, no separate output projection
    # output projection uses it: zeroing one row zeroes that logit everywhere
    model.embedding.embeddings.assign(
        tf.tensor_scatter_nd_update(model.embedding.embeddings, [[7]], tf.zeros([1, 64]))
    )
    logits = model((SRC, TGT)).numpy()
    np.testing.assert_allclose(logits[..., 7], 0.0, atol=1e-6)


def test_logits_shape_and_dtype():
    logits = tiny()((SRC, TGT))
    assert logits.shape == (2, 5, VOCAB) and logits.dtype == tf.float32


def test_causality():
    model = tiny()
    logits = model((SRC, TGT)).numpy()
    changed = TGT.copy()
    changed[:, 3:] = [[30, 31], [32, 33]]
    logits2 = model((SRC, changed)).numpy()
    np.testing.assert_allclose(logits2[:, :3], logits[:, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(logits2[:, 3:], logits[:, 3:])


def test_appending_source_padding_changes_nothing():
    model = tiny()
    logits = model((SRC, TGT)).numpy()
    padded = np.pad(SRC, [(0, 0), (0, 7)])
    np.testing.assert_allclose(model((padded, TGT)).numpy(), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}, {"d_k": 8, "d_v": 24}])
def test_decode_step_with_cache_reproduces_decode(overrides):
    model = tiny(**overrides)
    memory = model.encode(SRC)
    full = model.decode(TGT, memory, SRC).numpy()
    cache = model.init_cache(memory, SRC)
    for t in range(TGT.shape[1]):
        logits_t, cache = model.decode_step(TGT[:, t], t, cache)
        assert logits_t.shape == (2, VOCAB) and logits_t.dtype == tf.float32
        np.testing.assert_allclose(logits_t.numpy(), full[:, t], atol=1e-4)


def test_learned_positions_preset_runs_and_differs():
    model = tiny(positional="learned", max_length=16)
    assert model((SRC, TGT)).shape == (2, 5, VOCAB)
    assert any("position_embeddings" in w.path for w in model.weights)


def test_config_round_trip_reproduces_outputs():
    model = tiny()
    logits = model((SRC, TGT))
    clone = kt.Transformer.from_config(model.get_config())
    clone.build()
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone((SRC, TGT)), logits, rtol=1e-6)
    assert clone.config == model.config


def test_keras_file_round_trip(tmp_path):
    model = tiny()
    model.compile(
        optimizer=kt.paper_optimizer(64, 100),
        loss=kt.LabelSmoothedCrossEntropy(),
        metrics=[kt.MaskedAccuracy()],
    )
    # built before fit: a train step that creates no variable is traced once, not twice
    model.build()
    model.optimizer.build(model.trainable_variables)
    model.fit(tf.data.Dataset.from_tensors(((SRC, TGT), TGT)).repeat(2), verbose=0)
    logits = model((SRC, TGT)).numpy()
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert isinstance(restored, kt.Transformer)
    assert isinstance(restored.loss, kt.LabelSmoothedCrossEntropy)  # compile state restored
    np.testing.assert_allclose(restored((SRC, TGT)).numpy(), logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision(policy):
    keras.config.set_dtype_policy(policy)
    model = tiny()
    source = SRC.copy()
    source[1] = 0  # a fully padded source row
    logits = model((source, TGT), training=True)
    assert logits.dtype == tf.float32
    assert np.all(np.isfinite(logits.numpy()))
    assert all(w.dtype == "float32" for w in model.weights)
    assert model.compute_dtype == policy.split("_")[1]
    memory = model.encode(source)
    assert memory.dtype == model.compute_dtype


def reverse_task(n, length=8, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, VOCAB, size=(n, length)).astype(np.int32)
    target = tokens[:, ::-1]
    bos = np.full((n, 1), 2, np.int32)
    eos = np.full((n, 1), 3, np.int32)
    return tokens, np.concatenate([bos, target], 1), np.concatenate([target, eos], 1)


@pytest.mark.slow
def test_learns_to_reverse_sequences():
    keras.utils.set_random_seed(1)
    model = kt.Transformer(
        kt.TransformerConfig.preset(
            "tiny", vocab_size=VOCAB, d_model=64, d_ff=256, dropout_rate=0.0, label_smoothing=0.0
        )
    )
    model.compile(
        optimizer=kt.paper_optimizer(64, warmup_steps=200, scale=2.0),
        loss=kt.LabelSmoothedCrossEntropy(0.0),
        metrics=[kt.MaskedAccuracy()],
    )
    src, tgt_in, tgt_out = reverse_task(8192, seed=1)
    pairs = tf.data.Dataset.from_tensor_slices(((src, tgt_in), tgt_out))
    train = pairs.shuffle(8192, seed=0).batch(64).repeat()  # 128 batches a pass
    src, tgt_in, tgt_out = reverse_task(512, seed=2)  # held-out sequences
    held_out = tf.data.Dataset.from_tensor_slices(((src, tgt_in), tgt_out)).batch(128)
    # at most 6 passes (768 updates), stopped at the first check (every 32 updates, not
    # once a pass) where the held-out accuracy is reached: with set_random_seed(1), 2 and 3
    # after 192, 160 and 288 updates (seed 1 checked once a pass: 256)
    model.fit(
        train, epochs=24, steps_per_epoch=32, verbose=0, validation_data=held_out,
        callbacks=[StopAt(0.95)],
    )  # fmt: skip
    result = model.evaluate(held_out, verbose=0, return_dict=True)
    assert result["accuracy"] >= 0.95


class StopAt(keras.callbacks.Callback):
    """Ends `fit` after the first epoch whose validation accuracy reaches `accuracy`."""

    def __init__(self, accuracy: float):
        super().__init__()
        self.accuracy = accuracy

    def on_epoch_end(self, epoch, logs=None):
        if (logs or {}).get("val_accuracy", 0.0) >= self.accuracy:
            self.model.stop_training = True


def test_tf_checkpoint_round_trip_restores_every_weight(tmp_path):
    """train.py checkpoints with tf.train.Checkpoint: every variable must be reachable."""
    model = tiny()
    model.build()
    path = tf.train.Checkpoint(model=model).save(os.path.join(tmp_path, "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.weights)
    clone = tiny()
    clone.build()
    tf.train.Checkpoint(model=clone).restore(path).assert_existing_objects_matched()
    np.testing.assert_allclose(clone((SRC, TGT)), model((SRC, TGT)), rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
    "imports",
    ["import keras; import keras_transformer", "import keras_transformer as kt; kt.Transformer"],
)
def test_a_saved_model_loads_in_a_fresh_process(tmp_path, imports):
    """`.keras` files load wherever the package is imported after Keras, or used."""
    cfg = kt.TransformerConfig.preset("tiny", vocab_size=50)
    model = kt.Transformer(cfg)
    ids = np.array([[5, 6, 3, 0]], np.int32)
    want = model((ids, ids), training=False).numpy()
    path = str(tmp_path / "m.keras")
    model.save(path)
    np.save(tmp_path / "ids.npy", ids)
    code = (
        f"{imports}\nimport keras, numpy as np\n"
        f"ids = np.load({str(tmp_path / 'ids.npy')!r})\n"
        f"m = keras.saving.load_model({path!r})\n"
        f"np.save({str(tmp_path / 'got.npy')!r}, m((ids, ids), training=False).numpy())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "got.npy"), want, atol=1e-5)


MARIAN_LIKE = dict(
    decoder_layers=3,
    ffn_activation="swish",
    output_bias=True,
    sinusoid_layout="halves",
    decoder_start_zero=True,
)


@pytest.mark.parametrize("overrides", [MARIAN_LIKE, {"decoder_layers": 1}])
def test_decode_step_reproduces_decode_with_the_marian_options(overrides):
    model = tiny(**overrides)
    model.build()
    if model.embedding.bias is not None:
        model.embedding.bias.assign(np.linspace(-1, 1, VOCAB))
    assert len(model.decoder.blocks) == overrides["decoder_layers"]
    assert len(model.encoder.blocks) == 2
    memory = model.encode(SRC)
    full = model.decode(TGT, memory, SRC).numpy()
    cache = model.init_cache(memory, SRC)
    for t in range(TGT.shape[1]):
        logits_t, cache = model.decode_step(TGT[:, t], t, cache)
        np.testing.assert_allclose(logits_t.numpy(), full[:, t], atol=1e-4)


def test_decoder_start_zero_ignores_the_bos_row():
    model = tiny(decoder_start_zero=True)
    memory = model.encode(SRC)
    before = model.decode(TGT, memory, SRC).numpy()
    table = model.embedding.embeddings.numpy()
    table[2] = np.random.default_rng(3).normal(size=table.shape[1])  # bos's row
    model.embedding.embeddings.assign(table)
    after = model.decode(TGT, memory, SRC).numpy()
    others = np.arange(VOCAB) != 2  # bos's own logit is its row's (tied output projection)
    np.testing.assert_allclose(after[..., others], before[..., others], atol=1e-5)
    paper = tiny()
    paper.build()
    paper.set_weights(model.get_weights())
    assert not np.allclose(paper.decode(TGT, paper.encode(SRC), SRC).numpy(), before, atol=1e-3)


def test_marian_options_round_trip_through_the_config(tmp_path):
    model = tiny(**MARIAN_LIKE)
    model.build()
    model.embedding.bias.assign(np.linspace(-1, 1, VOCAB))
    logits = model((SRC, TGT)).numpy()
    path = str(tmp_path / "m.keras")
    model.save(path)
    revived = keras.saving.load_model(path)
    assert revived.config == model.config
    np.testing.assert_allclose(revived((SRC, TGT)).numpy(), logits, atol=1e-5)
