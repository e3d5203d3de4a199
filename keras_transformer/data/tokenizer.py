"""A joint SentencePiece vocabulary, and a tokenizer that runs inside the TensorFlow graph."""

from __future__ import annotations

import io
import os
import random
import re
from collections.abc import Iterable, Iterator

import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.config import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from keras_transformer.data.parallel_text import DataError

NUM_SPECIAL = 4
NUM_BYTE_PIECES = 256  # byte fallback: <0x00> ... <0xFF>, ids 4 ... 259
MODEL_TYPES = ("bpe", "unigram")


class TokenizerError(DataError):
    """A bad tokenizer setting or training text; the message names the flag."""


class TooManyPieces(TokenizerError):
    """The training text cannot fill `vocab_size` pieces; `largest` is the most it can."""

    def __init__(self, vocab_size: int, largest: int):
        super().__init__(
            f"--vocab-size {vocab_size} is more pieces than the training text allows: "
            f"pass --vocab-size {largest} or less"
        )
        self.vocab_size, self.largest = vocab_size, largest


def train_sentencepiece(
    sentences: Iterable[str],
    vocab_size: int,
    *,
    model_type: str = "bpe",
    max_sentences: int = 2_000_000,
    seed: int = 0,
    user_symbols: tuple[str, ...] = (),
) -> bytes:
    """Train one SentencePiece model on `sentences` (both languages) and return its proto.

    At most `max_sentences` are kept, a uniform sample drawn with `seed`, so memory stays
    bounded on any corpus size. (SentencePiece's own `input_sentence_size` sampling would do
    the same, but its sample differs from one process to the next whatever
    `set_random_generator_seed` says (sentencepiece 0.2.3), and the same command must give
    the same vocabulary.)
    Fixed ids: pad 0, unk 1, bos 2, eos 3, then the 256 byte pieces (byte fallback: a
    character absent from the training text is spelled in UTF-8 bytes, so `<unk>` never
    occurs), then every character of the training text, then the merges. `user_symbols`
    (e.g. a corpus tag, `data.mixing.TAG`) are reserved pieces, always one id each, placed
    right after eos (ids 4, 5, ...; the byte pieces then follow them).

    What round-trips through tokenize -> detokenize: text already in NFKC normal form with
    single spaces between words and none at the ends. SentencePiece's default normalization
    (nmt_nfkc) rewrites the rest before tokenizing: compatibility characters become their
    NFKC equivalents ("ﬁ" -> "fi", "①" -> "1", full-width "Ａ" -> "A"), runs of whitespace
    become one space and leading/trailing whitespace is dropped.

    Raises TooManyPieces when the text cannot fill `vocab_size` pieces (it names the largest
    size that fits), TokenizerError for other bad settings.
    """
    import sentencepiece as spm

    _check_settings(vocab_size, model_type, user_symbols)
    sample = reservoir_sample(sentences, max_sentences, seed)
    if not sample:
        raise TokenizerError("no sentences to train the SentencePiece model on")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample),
            model_writer=model,
            **_trainer_options(vocab_size, model_type, user_symbols),
        )
    except RuntimeError as err:
        error = _vocab_size_error(err, vocab_size)
        if error is None:
            raise
        raise error from None
    return model.getvalue()


def _check_settings(vocab_size, model_type: str, user_symbols: tuple[str, ...]) -> None:
    """Raise TokenizerError naming the flag for a model type or vocabulary size never valid."""
    if model_type not in MODEL_TYPES:
        raise TokenizerError(f"--spm-model-type must be one of {MODEL_TYPES}, got {model_type!r}")
    minimum = NUM_SPECIAL + len(user_symbols) + NUM_BYTE_PIECES + 1
    if not isinstance(vocab_size, int) or vocab_size < minimum:
        raise TokenizerError(
            f"--vocab-size must be at least {minimum} ({NUM_SPECIAL} special pieces, "
            f"{NUM_BYTE_PIECES} byte pieces for unknown characters, then the characters "
            f"of the training text), got {vocab_size!r}"
        )


def _trainer_options(vocab_size: int, model_type: str, user_symbols: tuple[str, ...]) -> dict:
    """SentencePieceTrainer.train's settings: the fixed ids, byte fallback, every character."""
    return {
        "vocab_size": vocab_size,
        "model_type": model_type,
        "character_coverage": 1.0,
        "byte_fallback": True,
        "pad_id": PAD_ID,
        "unk_id": UNK_ID,
        "bos_id": BOS_ID,
        "eos_id": EOS_ID,
        "pad_piece": "<pad>",
        "unk_piece": "<unk>",
        "bos_piece": "<s>",
        "eos_piece": "</s>",
        "num_threads": os.cpu_count() or 1,
        "minloglevel": 2,
        **({"user_defined_symbols": list(user_symbols)} if user_symbols else {}),
    }


def _vocab_size_error(err: RuntimeError, vocab_size: int) -> TokenizerError | None:
    """The TokenizerError for SentencePiece's vocabulary-size errors; None for any other."""
    too_many = re.search(r"Vocabulary size too high \(\d+\).*<= (\d+)", str(err))
    if too_many:
        return TooManyPieces(vocab_size, int(too_many.group(1)))
    sizes = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(err))
    if not sizes:
        return None
    return TokenizerError(
        f"--vocab-size {vocab_size} is too small: the {NUM_SPECIAL} special pieces, "
        f"{NUM_BYTE_PIECES} byte pieces and the characters of the training text need "
        f"at least {sizes.group(2)}"
    )


def pair_sentences(pairs: Iterable[tuple[bytes, bytes]]) -> Iterator[str]:
    """Both sides of (source, target) UTF-8 pairs, e.g. a corpus's
    `dataset.as_numpy_iterator()`: the text a joint vocabulary is trained on."""
    for src, tgt in pairs:
        yield src.decode("utf-8")
        yield tgt.decode("utf-8")


def reservoir_sample(items: Iterable[str], size: int, seed: int) -> list[str]:
    """A uniform sample of at most `size` of `items`, in one pass (Algorithm R), seeded."""
    rng = random.Random(seed)
    sample: list[str] = []
    for n, item in enumerate(items):
        if len(sample) < size:
            sample.append(item)
        else:
            j = rng.randrange(n + 1)
            if j < size:
                sample[j] = item
    return sample


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
            with tf.io.gfile.GFile(model, "rb") as handle:  # gs://... too
                model = handle.read()
        self._proto = model
        self.tokenizer = tf_text.SentencepieceTokenizer(
            model=model, out_type=tf.int32, add_bos=False, add_eos=False
        )
        # SentencePiece has CPU kernels only. tensorflow_text creates its model resource
        # (SentencepieceOp) with no device, and a SavedModel re-creates it from that setting:
        # set the resource's device (TrackableResource's `device`) so that a GPU server places
        # it on the CPU too (TF Serving #2016).
        self.tokenizer._model_resource._resource_device = "/device:CPU:0"
        self.vocab_size = int(self.tokenizer.vocab_size())
        self.model_asset = None

    @classmethod
    def trained_on(cls, pairs: Iterable[tuple[bytes, bytes]], vocab_size: int, **options):
        """A tokenizer trained on both sides of UTF-8 `pairs` (`pair_sentences`), e.g. a
        corpus's `dataset.as_numpy_iterator()`; `options` are `train_sentencepiece`'s."""
        return cls(train_sentencepiece(pair_sentences(pairs), vocab_size, **options))

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
