"""OPUS-MT's tokenization, in the TensorFlow graph: two SentencePiece models and one vocabulary.

An OPUS-MT model cuts its source with `source.spm` and its target with `target.spm`, and maps
both through one shared vocabulary *by string*: a piece's id is its row in the vocabulary,
not its id in either SentencePiece model (a piece absent from the vocabulary is `<unk>`, never
dropped). A multilingual model's target-language token at the start of the source (`>>fra<<`)
is one token, not cut by SentencePiece (Hugging Face's `MarianTokenizer` does the same).
Outputs go back to text through `target.spm`.

`MarianTokenizer` offers what the translator and the training pipeline use of
`SubwordTokenizer`: `tokenize` (the source side), `tokenize_target`, `detokenize`,
`vocab_size`, and `.tokenizer` with `tokenize` / `id_to_string` / `detokenize`. Its ids are
this package's (pad 0, unk 1, bos 2, eos 3; see `importers/run.py` for the mapping from
Marian's).
"""

from __future__ import annotations

import json

import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.config import RESERVED_IDS, UNK_ID

LANGUAGE_TOKEN = r">>[^<>\s]+<<"  # a target-language token: >>fra<<, >>por_Latn<<
VOCAB_FILE = "vocab.json"  # the run's pieces in id order (a JSON list)
SOURCE_SPM, TARGET_SPM = "source.spm", "target.spm"
# the pieces of the ids that Marian's vocabulary does not have (pad and bos: see run.py)
RESERVED_PIECES = {0: "<pad>", 2: "<s>"}
CPU = "/device:CPU:0"


class MarianPieces(tf.Module):
    """The graph side: two SentencePiece models and the piece <-> id tables.

    Args:
        source_spm, target_spm: the SentencePiece model protos.
        pieces: the vocabulary in this package's id order; ids in RESERVED_PIECES are not
            looked up (no piece maps to them).
    """

    def __init__(self, source_spm: bytes, target_spm: bytes, pieces: list[str], name=None):
        super().__init__(name=name)
        self.source = tf_text.SentencepieceTokenizer(model=source_spm, out_type=tf.string)
        self.target = tf_text.SentencepieceTokenizer(model=target_spm, out_type=tf.string)
        for spm in (self.source, self.target):  # CPU kernels only (see SubwordTokenizer)
            spm._model_resource._resource_device = CPU
        keys = [p for i, p in enumerate(pieces) if i not in RESERVED_PIECES]
        values = [i for i in range(len(pieces)) if i not in RESERVED_PIECES]
        self.ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(keys, tf.string), tf.constant(values, tf.int32)
            ),
            default_value=UNK_ID,
        )
        self.pieces = tf.constant(pieces, tf.string)

    def tokenize(self, strings):
        """(N,) source strings -> ragged ids (N, None), a leading >>xxx<< kept whole."""
        strings = tf.convert_to_tensor(strings, tf.string)
        has_code = tf.strings.regex_full_match(strings, f"(?s){LANGUAGE_TOKEN}.*")
        code = tf.strings.regex_replace(strings, f"(?s)^({LANGUAGE_TOKEN}).*$", r"\1")
        rest = tf.where(
            has_code, tf.strings.regex_replace(strings, f"^{LANGUAGE_TOKEN}", ""), strings
        )
        code_ids = tf.ragged.boolean_mask(self.ids.lookup(code)[:, None], has_code[:, None])
        return tf.concat([code_ids, self.lookup(self.source.tokenize(rest))], axis=1)

    def tokenize_target(self, strings):
        """(N,) target strings -> ragged ids (N, None), through target.spm."""
        return self.lookup(self.target.tokenize(tf.convert_to_tensor(strings, tf.string)))

    def lookup(self, pieces: tf.RaggedTensor) -> tf.RaggedTensor:
        return pieces.with_flat_values(self.ids.lookup(pieces.flat_values))

    def id_to_string(self, ids):
        """ids (any shape) -> their pieces."""
        return tf.gather(self.pieces, ids)

    def detokenize(self, ids):
        """ragged (N, None) ids (no reserved ids) -> (N,) strings: target.spm's decoding of
        its pieces ("▁" is a space, none before the first word), done on the pieces' text as
        SentencePiece's `decode_pieces` does (Hugging Face's MarianTokenizer calls it), so
        that a piece of the vocabulary that target.spm lacks keeps its text."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        pieces = ids.with_flat_values(tf.gather(self.pieces, ids.flat_values))
        text = tf.strings.regex_replace(tf.strings.reduce_join(pieces, axis=-1), "▁", " ")
        return tf.strings.regex_replace(text, "^ ", "")


class MarianTokenizer(tf.Module):
    """An imported OPUS-MT model's tokenizer (see the module docstring).

    Args:
        source_spm, target_spm: the SentencePiece model protos (bytes).
        pieces: the shared vocabulary in this package's id order.
    """

    def __init__(self, source_spm: bytes, target_spm: bytes, pieces: list[str], name=None):
        super().__init__(name=name or "marian_tokenizer")
        self.source_spm, self.target_spm = source_spm, target_spm
        self.vocab = list(pieces)
        self.vocab_size = len(pieces)
        self.tokenizer = MarianPieces(source_spm, target_spm, self.vocab)
        self.model_asset = None

    @property
    def proto(self) -> bytes:
        """The target side's SentencePiece model: the export's assets/spm.model (what
        kt-evaluate counts target pieces with)."""
        return self.target_spm

    def files(self) -> dict[str, bytes]:
        """What a run directory holds of it: name -> bytes."""
        vocab = json.dumps(self.vocab, ensure_ascii=False, indent=0).encode("utf-8")
        return {SOURCE_SPM: self.source_spm, TARGET_SPM: self.target_spm, VOCAB_FILE: vocab}

    @classmethod
    def from_files(cls, read) -> MarianTokenizer:
        """From `read(name) -> bytes` over the names of `files()`."""
        return cls(read(SOURCE_SPM), read(TARGET_SPM), json.loads(read(VOCAB_FILE)))

    def tokenize(self, strings):
        with tf.device(CPU):
            return self.tokenizer.tokenize(strings)

    def tokenize_target(self, strings):
        with tf.device(CPU):
            return self.tokenizer.tokenize_target(strings)

    def detokenize(self, ids):
        """ids (N, L) or ragged -> (N,) strings, ignoring pad, unk, bos and eos."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        with tf.device(CPU):
            return self.tokenizer.detokenize(tf.ragged.boolean_mask(ids, ids >= RESERVED_IDS))

    def id_to_piece(self, ids):
        return self.tokenizer.id_to_string(ids)
