"""`dry_run(plan)`: the plan `train(plan)` would follow, resolved without training."""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from keras_transformer.data import DataMissing
from keras_transformer.run_dir import Run
from keras_transformer.settings.args import COUNTED, TrainSettings, describe
from keras_transformer.settings.plan import Plan, replica_tokens
from keras_transformer.training.preparation import load_data, planned_settings
from keras_transformer.training.strategy import (
    StrategyError,
    check_devices,
    device_report,
    make_strategy,
    set_up_devices,
    tf_config,
)

logger = logging.getLogger(__name__)


def dry_run(plan: Plan) -> str:
    """The plan `train(plan)` would follow, as train shows it (the corpora and the settings
    table), from the corpus sizes alone: no tokenizer trained, nothing downloaded (neither
    Multi30k nor TFDS), nothing written (not even --model-dir). A corpus not at hand (not
    downloaded or prepared yet) is of unknown size: the plan of a large corpus, said so."""
    args = plan.args
    set_up_devices(args)  # before anything starts TensorFlow's runtime
    # the replicas bound the automatic micro-batch; multi_worker's from TF_CONFIG (building
    # the strategy would wait for the peers)
    if args.strategy == "multi_worker":
        replicas = planned_replicas(args.strategy)
    else:
        strategy = make_strategy(args.strategy)
        logger.info("%s", device_report(strategy))
        replicas = strategy.num_replicas_in_sync
    try:  # a preview of a GPU recipe on another machine still shows its plan
        check_devices(args.precision, args.cpu_devices)
        device_note = ""
    except StrategyError as err:
        device_note = f"on this machine, kt-train would stop: {err}\n"
    local = dataclasses.replace(args, tfds_download=False)
    try:
        train_data, valid = load_data(dataclasses.replace(plan, args=local), download=False)
        corpora = f"train: {train_data.report()}\nvalidation: {valid.report()}"
    except DataMissing as err:
        train_data = None
        corpora = (
            f"train: not at hand ({err})\n"
            "corpus size unknown: the plan of a large corpus (1,000,000 pairs or more); "
            "a smaller one gets the small-corpus recipe"
        )
    settings = planned_settings(Run(args.model_dir), args, train_data, replicas)
    return (
        f"{corpora}\n"
        f"settings (config.json):\n{describe(settings, args, pending=COUNTED)}\n"
        f"{log_replica_tokens(settings, replicas)}\n{device_note}"
        f"dry run: nothing trained, nothing written to {args.model_dir}"
    )


def planned_replicas(name: str) -> int:
    """The replicas of `strategy.make_strategy(name)`'s strategy (`--dry-run`). For multi_worker,
    counted from TF_CONFIG (chief and workers, each with this machine's GPUs, or one CPU)
    without building the strategy: that would start its server and wait for the peers."""
    if name != "multi_worker":
        return make_strategy(name).num_replicas_in_sync
    cluster = tf_config()["cluster"]
    tasks = len(cluster.get("chief") or []) + len(cluster.get("worker") or [])
    return tasks * max(1, len(tf.config.list_logical_devices("GPU")))


def log_replica_tokens(settings: TrainSettings, replicas: int) -> str:
    """Log the tokens per replica (a warning below the floor); returns the line."""
    line, warning = replica_tokens(settings, replicas)
    logger.info("%s", line)
    if warning:
        logger.warning("%s", warning)
    return line


__all__ = ["dry_run", "log_replica_tokens", "planned_replicas"]
