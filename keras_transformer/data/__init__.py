"""Parallel text sources, the SentencePiece tokenizer and the batching pipeline."""

from keras_transformer.data.pipeline import (
    PipelineError,
    PipelineStats,
    bucket_boundaries,
    make_batches,
    training_batches,
)
from keras_transformer.data.sources import (
    DataError,
    DataMissing,
    ParallelText,
    load_parallel,
    read_parallel_files,
)
from keras_transformer.data.tokenizer import (
    SubwordTokenizer,
    TokenizerError,
    train_sentencepiece,
)

__all__ = [
    "DataError",
    "DataMissing",
    "ParallelText",
    "PipelineError",
    "PipelineStats",
    "SubwordTokenizer",
    "TokenizerError",
    "bucket_boundaries",
    "load_parallel",
    "make_batches",
    "read_parallel_files",
    "train_sentencepiece",
    "training_batches",
]
