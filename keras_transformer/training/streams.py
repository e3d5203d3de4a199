"""A run's input: the training stream from a stream position (one per worker under
multi_worker), the validation batches, and the report of the pairs the stream dropped."""

from __future__ import annotations

import logging

import tensorflow as tf

from keras_transformer.data import PipelineStats, make_batches, training_batches
from keras_transformer.data.batching import batch_count
from keras_transformer.data.subword import subword_sampler
from keras_transformer.settings.args import TrainSettings
from keras_transformer.training.step import TrainingModel

logger = logging.getLogger(__name__)


def validation_batches(valid, tokenizer, settings: TrainSettings) -> tf.data.Dataset:
    """The validation batches, with their count attached: Keras then stops after the last
    one instead of running into the end of the data (and warning that it ran out). The
    count comes from the pairs' lengths (`batch_count`), not from a pass over the batches."""
    sizes = dict(batch_tokens=settings.batch_tokens, max_length=settings.max_length)
    batches = make_batches(valid.dataset, tokenizer, shuffle=False, **sizes)
    count = batch_count(valid.dataset, tokenizer, **sizes)
    return batches.apply(tf.data.experimental.assert_cardinality(count))


def training_stream(train_data, tokenizer, settings: TrainSettings, stats, split=1):
    """`data_from(start)`: the training batches from stream position `start`, position-tagged,
    segmented as --subword-alpha says (`data.subword`: the training sentences only).

    `data_from(start, shard=(index, count), replicas=n)`: one worker's stream of its share of
    the pairs, in batches of 1/n of the token budget (one replica's).
    With --jit-compile, a bucket's batches all have its row count, divisible by the rows'
    split: `split` replicas (one stream's batches split between them) x --accum-steps."""
    subword = subword_sampler(tokenizer, settings.subword_alpha)

    def data_from(start: int, shard=None, replicas: int = 1) -> tf.data.Dataset:
        static = settings.accum_steps * (split if shard is None else 1)
        return training_batches(
            train_data,
            tokenizer,
            batch_tokens=settings.batch_tokens * settings.accum_steps // replicas,
            max_length=settings.max_length,
            seed=settings.seed,
            start=start,
            stats=stats,
            positions=True,  # TrainingModel keeps the stream position of the next batch
            subword=subword,
            shard=shard,
            static_rows=static if settings.jit_compile else None,
        )

    return data_from


def worker_streams(strategy, model: TrainingModel, stream):
    """Multi-worker input: `data_from(_)` gives every worker a stream of its own share of
    each pass's pairs (`training_batches(shard=...)`: pairs w, w + W, ... for worker w of
    W), which it alone reads and tokenizes; each of its replicas takes whole batches of
    1/(replicas of the job) of the token budget, so an update still holds about
    --batch-tokens x --accum-steps tokens. The stream starts after the last batch this
    worker's replicas trained on (`model.replica_next`), so a resume is exact."""
    ids = strategy.run(lambda: tf.distribute.get_replica_context().replica_id_in_sync_group)
    local = [int(i) for i in strategy.experimental_local_results(ids)]

    def data_from(_start=None):
        start = int(max(model.replica_next.numpy()[local]))

        def worker_stream(context: tf.distribute.InputContext) -> tf.data.Dataset:
            shard = (context.input_pipeline_id, context.num_input_pipelines)
            logger.info(
                "worker input: pairs %d, %d + %d, ... of every pass (share %d of %d), from "
                "stream position %d",
                shard[0], shard[0], shard[1], shard[0] + 1, shard[1], start,
            )  # fmt: skip
            return stream(start, shard=shard, replicas=context.num_replicas_in_sync)

        return strategy.distribute_datasets_from_function(worker_stream)

    return data_from


def report_dropped(stats: PipelineStats, settings: TrainSettings) -> None:
    """Print how many training pairs over --max-length the pipeline dropped, if any."""
    if int(stats.too_long.numpy()):
        logger.info(
            "dropped %d training pairs longer than --max-length %d",
            int(stats.too_long.numpy()),
            settings.max_length,
        )


__all__ = ["report_dropped", "training_stream", "validation_batches", "worker_streams"]
