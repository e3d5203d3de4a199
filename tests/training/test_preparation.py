"""The automatic recipe follows the real corpus size, whatever the source."""

import pytest

from keras_transformer.data import SubwordTokenizer, load_parallel, train_sentencepiece
from keras_transformer.settings.args import TrainArgs
from keras_transformer.settings.recipe import resolve
from keras_transformer.training.preparation import count_batches
from tests.data import tfds_fixture


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The same pairs as a prepared TFDS dataset and as two text files."""
    folder = tmp_path_factory.mktemp("corpora")
    data_dir = tfds_fixture.prepare(str(folder / "tfds"))
    tfds_train = load_parallel(f"tfds:{tfds_fixture.NAME}", "train", "en", "de", data_dir=data_dir)
    pairs = [(s.decode(), t.decode()) for s, t in tfds_train.dataset.as_numpy_iterator()]
    paths = []
    for side, name in ((0, "train.en"), (1, "train.de")):
        paths.append(str(folder / name))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            handle.writelines(pair[side] + "\n" for pair in pairs)
    files_train = load_parallel("files", "train", "en", "de", files=tuple(paths))
    return tfds_train, files_train, pairs


def test_a_small_tfds_corpus_gets_the_small_corpus_recipe(corpora):
    tfds_train, files_train, pairs = corpora
    tokenizer = SubwordTokenizer(train_sentencepiece([s for p in pairs for s in p], 300))
    settings = []
    for corpus in (tfds_train, files_train):

        def batches_per_pass(vocab_size, batch_tokens, corpus=corpus):
            return count_batches(corpus, tokenizer, batch_tokens, 32)

        args = TrainArgs(preset="tiny", vocab_size=300, batch_tokens=512, max_length=32)
        settings.append(
            resolve(args, num_pairs=corpus.num_pairs, batches_per_pass=batches_per_pass)
        )
    from_tfds, from_files = settings
    # TFDS counts the pairs with an empty side (1200), the files do not have them (1029)
    assert (tfds_train.num_pairs, files_train.num_pairs) == (1200, 1029)
    assert from_tfds.steps_per_epoch == from_files.steps_per_epoch
    # about one pass: 1029 pairs of ~8 target tokens + bos/eos in 512-token batches
    assert 10 <= from_tfds.steps_per_epoch <= 40
    assert (from_tfds.warmup_steps, from_tfds.lr_scale, from_tfds.train_steps) == (
        from_files.warmup_steps,
        0.8,
        20 * from_tfds.steps_per_epoch,
    )


def test_steps_per_epoch_are_counted_on_the_pass_order(tmp_path):
    """A corpus of a short half then a long half: the count on a sample of the first pass's
    order (pieces over the whole corpus) is near the full count; a sample in storage order
    (short sentences only) would count about half as many batches."""
    short = [(f"a dog {i} .", f"ein Hund {i} .") for i in range(1000)]
    long = [
        (f"a dog {i} runs over the green grass near the old red house by the river .",
         f"ein Hund {i} rennt über das grüne Gras nahe dem alten roten Haus am Fluss .")
        for i in range(1000)
    ]  # fmt: skip
    paths = []
    for side, name in ((0, "train.en"), (1, "train.de")):
        paths.append(str(tmp_path / name))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            handle.writelines(pair[side] + "\n" for pair in short + long)
    corpus = load_parallel("files", "train", "en", "de", files=tuple(paths))
    tokenizer = SubwordTokenizer(train_sentencepiece([s for p in short + long for s in p], 300))
    full = count_batches(corpus, tokenizer, 512, 64, sample=2000)
    sampled = count_batches(corpus, tokenizer, 512, 64, sample=200)
    assert abs(sampled - full) <= 0.2 * full, (sampled, full)


def test_a_waiting_worker_names_tensorflows_chief(tmp_path, monkeypatch):
    """Under a layout with a chief job (Kubeflow's TFJob), the run directory's writer is
    chief:0, not worker 0: the worker that gave up waiting says which task to start."""
    import json

    from keras_transformer.settings.args import ConfigError
    from keras_transformer.training.preparation import wait_for

    cluster = {"chief": ["h:1"], "worker": ["h:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker"}}))
    with pytest.raises(ConfigError, match=r"start the chief \(TF_CONFIG task chief:0\)"):
        wait_for(str(tmp_path / "config.json"), 0, str(tmp_path / "worker_0.gave_up"))
