"""A joint SentencePiece vocabulary, and a tokenizer that runs inside the TensorFlow graph."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Iterable

import tensorflow as tf
import tensorflow_text as tf_text

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
NUM_SPECIAL = 4
MODEL_TYPES = ("bpe", "unigram")


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    *,
    model_type: str = "bpe",
    max_sentences: int = 2_000_000,
    seed: int = 0,
) -> bytes:
    """Train one SentencePiece model on `sentences` (both languages) and return its proto.

    At most `max_sentences` are kept, by reservoir sampling, so memory stays bounded on
    any corpus size. Fixed ids: pad 0, unk 1, bos 2, eos 3.
    """
    import sentencepiece as spm

    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
    if vocab_size <= NUM_SPECIAL:
        raise ValueError(f"vocab_size must exceed {NUM_SPECIAL}, got {vocab_size}")
    rng = random.Random(seed)
    sample: list[str] = []
    for n, sentence in enumerate(sentences):
        if len(sample) < max_sentences:
            sample.append(sentence)
        else:
            j = rng.randrange(n + 1)
            if j < max_sentences:
                sample[j] = sentence
    if not sample:
        raise ValueError("no sentences to train the SentencePiece model on")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_piece="<pad>",
        unk_piece="<unk>",
        bos_piece="<s>",
        eos_piece="</s>",
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    return model.getvalue()


class SubwordTokenizer(tf.Module):
    """SentencePiece in the graph (tensorflow-text), saved with any SavedModel that holds it.

    Args:
        model: the serialized SentencePiece model proto (bytes), or a path to a .model file.

    `tokenize(strings (N,)) -> RaggedTensor (N, None) int32` without bos/eos;
    `detokenize(ids (N, L) or ragged) -> (N,) strings`, ignoring pad, bos and eos.
    The proto is also tracked as an asset file, so exports carry `assets/<name>.model`.

    Seed first (`keras.utils.set_random_seed`), then build tokenizers: `tf.random.set_seed`
    clears TensorFlow's kernel cache and with it the SentencePiece resources built before.
    """

    def __init__(self, model: bytes | str, name: str = "subword_tokenizer"):
        super().__init__(name=name)
        if isinstance(model, str):
            with open(model, "rb") as handle:
                model = handle.read()
        self._proto = model
        self.tokenizer = tf_text.SentencepieceTokenizer(
            model=model, out_type=tf.int32, add_bos=False, add_eos=False
        )
        self.vocab_size = int(self.tokenizer.vocab_size())
        self.model_asset = None

    def save(self, path: str) -> None:
        """Write the .model file (and track it as this module's asset)."""
        with open(path, "wb") as handle:
            handle.write(self._proto)
        self.model_asset = tf.saved_model.Asset(path)

    @classmethod
    def load(cls, path: str) -> SubwordTokenizer:
        tokenizer = cls(path)
        tokenizer.model_asset = tf.saved_model.Asset(path)
        return tokenizer

    @property
    def proto(self) -> bytes:
        return self._proto

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, strings):
        return self.tokenizer.tokenize(strings)

    @tf.function
    def detokenize(self, ids):
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        ids = tf.ragged.boolean_mask(ids, ids >= NUM_SPECIAL)
        return self.tokenizer.detokenize(ids)

    def id_to_piece(self, ids):
        return self.tokenizer.id_to_string(ids)
