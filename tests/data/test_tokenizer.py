import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import SubwordTokenizer, train_sentencepiece
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def read(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


@pytest.fixture(scope="module")
def tokenizer(multi30k_dir):
    sentences = read(os.path.join(multi30k_dir, "train.en.gz")) + read(
        os.path.join(multi30k_dir, "train.de.gz")
    )
    return SubwordTokenizer(train_sentencepiece(sentences, 4000))


def test_special_ids_are_fixed(tokenizer):
    pieces = tokenizer.id_to_piece(tf.constant([PAD_ID, UNK_ID, BOS_ID, EOS_ID])).numpy().tolist()
    assert pieces == [b"<pad>", b"<unk>", b"<s>", b"</s>"]
    assert tokenizer.vocab_size == 4000


def test_round_trip_on_validation_sentences(tokenizer, multi30k_dir):
    sentences = read(os.path.join(multi30k_dir, "val.en.gz")) + read(
        os.path.join(multi30k_dir, "val.de.gz")
    )
    ids = tokenizer.tokenize(tf.constant(sentences))
    back = [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]
    normalized = [" ".join(s.split()) for s in sentences]  # SentencePiece collapses whitespace
    mismatches = sum(a != b for a, b in zip(back, normalized))
    assert mismatches <= len(sentences) // 200, f"{mismatches} of {len(sentences)} differ"


def test_detokenize_ignores_padding_and_markers(tokenizer):
    ids = tokenizer.tokenize(tf.constant(["Two dogs play."])).to_tensor()
    padded = tf.concat([[[BOS_ID]], ids, [[EOS_ID, PAD_ID, PAD_ID]]], axis=1)
    assert tokenizer.detokenize(padded).numpy()[0] == b"Two dogs play."


def test_tokenizer_survives_saved_model(tokenizer, tmp_path):
    model_path = os.path.join(tmp_path, "spm.model")
    tokenizer.save(model_path)
    export = os.path.join(tmp_path, "saved")
    tf.saved_model.save(tokenizer, export)
    restored = tf.saved_model.load(export)
    text = tf.constant(["A man rides a bike.", "Ein Mann fährt Fahrrad."])
    np.testing.assert_array_equal(
        restored.tokenize(text).to_tensor(), tokenizer.tokenize(text).to_tensor()
    )
    assert os.path.exists(os.path.join(export, "assets", "spm.model"))


def test_bounded_sample_and_bad_arguments():
    with pytest.raises(ValueError, match="model_type"):
        train_sentencepiece(["a b"], 100, model_type="word-ish")
    with pytest.raises(ValueError, match="no sentences"):
        train_sentencepiece([], 100)
