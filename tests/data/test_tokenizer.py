import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import SubwordTokenizer, train_sentencepiece
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    NUM_BYTE_PIECES,
    NUM_SPECIAL,
    PAD_ID,
    UNK_ID,
    TokenizerError,
    TooManyPieces,
    pair_sentences,
)
from keras_transformer.run_dir import Run


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
    Run(str(tmp_path)).save_tokenizer(tokenizer)
    export = os.path.join(tmp_path, "saved")
    tf.saved_model.save(tokenizer, export)
    restored = tf.saved_model.load(export)
    text = tf.constant(["A man rides a bike.", "Ein Mann fährt Fahrrad."])
    np.testing.assert_array_equal(
        restored.tokenize(text).to_tensor(), tokenizer.tokenize(text).to_tensor()
    )
    assert os.path.exists(os.path.join(export, "assets", "spm.model"))


@pytest.fixture(scope="module")
def ascii_tokenizer(multi30k_dir):
    english = read(os.path.join(multi30k_dir, "train.en.gz"))
    ascii_only = [s for s in english if s.isascii()]
    assert len(ascii_only) > 20_000
    return SubwordTokenizer(train_sentencepiece(ascii_only, 500))


def test_unknown_characters_round_trip_as_bytes(ascii_tokenizer):
    """Characters absent from the (ASCII-only) training text come back, spelled in bytes."""
    texts = ["naïve café 東京 🙂", "Ein Mädchen läuft über die Straße.", "Ω≈ç√∫ x"]
    ids = ascii_tokenizer.tokenize(tf.constant(texts))
    assert not np.any(ids.flat_values.numpy() == UNK_ID)
    back = [s.decode("utf-8") for s in ascii_tokenizer.detokenize(ids).numpy()]
    assert back == texts
    # "東" is E6 9D B1 in UTF-8: three byte pieces, at ids 4 + byte value.
    east = ascii_tokenizer.tokenize(tf.constant(["東"])).numpy()[0].tolist()
    assert east[-3:] == [NUM_SPECIAL + 0xE6, NUM_SPECIAL + 0x9D, NUM_SPECIAL + 0xB1]
    pieces = ascii_tokenizer.id_to_piece(tf.constant(east[-3:])).numpy().tolist()
    assert pieces == [b"<0xE6>", b"<0x9D>", b"<0xB1>"]
    # Padded, with bos/eos: the same text (what the translator detokenizes).
    padded = tf.concat([[[BOS_ID]], ids[:1].to_tensor(), [[EOS_ID, PAD_ID]]], axis=1)
    assert ascii_tokenizer.detokenize(padded).numpy()[0].decode() == texts[0]


def test_vocabulary_accounts_for_byte_pieces(ascii_tokenizer):
    assert ascii_tokenizer.vocab_size == 500
    ids = tf.range(NUM_SPECIAL, NUM_SPECIAL + NUM_BYTE_PIECES)
    pieces = ascii_tokenizer.id_to_piece(ids).numpy().tolist()
    assert pieces == [f"<0x{b:02X}>".encode() for b in range(NUM_BYTE_PIECES)]
    # every id of a real sentence is inside the vocabulary the model is built with
    ids = ascii_tokenizer.tokenize(tf.constant(["A man rides a bike 🙂"])).flat_values.numpy()
    assert ids.max() < ascii_tokenizer.vocab_size and ids.min() >= NUM_SPECIAL


def test_bounded_sample_and_bad_arguments(multi30k_dir):
    with pytest.raises(TokenizerError, match="--spm-model-type"):
        train_sentencepiece(["a b"], 400, model_type="word-ish")
    with pytest.raises(TokenizerError, match="no sentences"):
        train_sentencepiece([], 400)
    with pytest.raises(TokenizerError, match=r"--vocab-size must be at least 261 .*got 100"):
        train_sentencepiece(["a b"], 100)
    # room for the bytes but not for the 100 characters of Multi30k
    sentences = read(os.path.join(multi30k_dir, "train.de.gz"))
    with pytest.raises(TokenizerError, match=r"--vocab-size 300 is too small: .*at least 3\d\d"):
        train_sentencepiece(sentences, 300)


def test_what_round_trips_and_what_normalization_changes(ascii_tokenizer):
    """NFKC text with single spaces comes back as it was; compatibility characters come back
    as their NFKC forms and whitespace runs as one space (SentencePiece's nmt_nfkc)."""
    same = ["Ein Mädchen läuft über die Straße.", "naïve café 東京 🙂", "Ω ≈ √2 ≠ 3"]
    changed = {
        "ﬁne": "fine",
        "① step": "1 step",
        "ＡＢ": "AB",
        "x²": "x2",
        "  two   spaces ": "two spaces",
    }
    texts = same + list(changed)
    back = ascii_tokenizer.detokenize(ascii_tokenizer.tokenize(tf.constant(texts))).numpy()
    back = [b.decode("utf-8") for b in back]
    assert back == same + list(changed.values())


def test_too_many_pieces_names_the_largest_that_fits():
    sentences = [f"the cat sat on mat {i}" for i in range(40)]
    with pytest.raises(
        TooManyPieces, match=r"--vocab-size 2000 is more .*--vocab-size (\d+) or less"
    ) as err:
        train_sentencepiece(sentences, 2000)
    largest = err.value.largest
    assert 261 < largest < 2000
    assert SubwordTokenizer(train_sentencepiece(sentences, largest)).vocab_size == largest


def test_the_sample_is_bounded_and_seeded(multi30k_dir):
    sentences = read(os.path.join(multi30k_dir, "train.en.gz"))
    first = train_sentencepiece(sentences, 600, max_sentences=2000, seed=1)
    assert train_sentencepiece(sentences, 600, max_sentences=2000, seed=1) == first
    assert train_sentencepiece(sentences, 600, max_sentences=2000, seed=2) != first


def test_pair_sentences_are_both_sides_decoded_in_order():
    """What a joint vocabulary is trained on: source then target of each pair, as str."""
    pairs = tf.data.Dataset.from_tensor_slices((["Zwei Männer", "b"], ["Two men", "ß"]))
    got = pair_sentences(pairs.as_numpy_iterator())
    assert list(got) == ["Zwei Männer", "Two men", "b", "ß"]
