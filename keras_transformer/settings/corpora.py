"""The training corpora of kt-train's list flags (--dataset, --train-src/--train-tgt,
--train-weights, --tag-corpus): which corpora, their sampling weights and which are tagged,
each bad combination a ConfigError naming the flag. Parsed once (`parse_corpora`, called by
`settings.validation.validate`) into a `Corpora` that the plan carries."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from keras_transformer.config import ConfigError

if TYPE_CHECKING:
    from keras_transformer.settings.args import TrainArgs


def split_list(value: str | None) -> list[str]:
    """The items of a comma-separated flag value ([] for None)."""
    return [] if value is None else [item.strip() for item in value.split(",")]


@dataclasses.dataclass(frozen=True)
class Corpora:
    """The training corpora of --dataset, in order: (kind, (source, target) files or None);
    their sampling weights (None: their sizes) and the 0-based indices of the tagged ones."""

    sources: tuple[tuple[str, tuple[str, str] | None], ...]
    weights: tuple[float, ...] | None = None
    tagged: tuple[int, ...] = ()


def parse_corpora(args: TrainArgs) -> Corpora:
    """The training corpora of the list flags (`Corpora`).

    `files` in --dataset stands for every --train-src/--train-tgt pair, in order. Raises
    ConfigError naming the flag for lists that do not fit together, bad weights or tags.
    """
    kinds = split_list(args.dataset)
    if any(not kind for kind in kinds):
        raise ConfigError(f"--dataset {args.dataset!r} has an empty item: remove the extra comma")
    if kinds.count("files") > 1:
        raise ConfigError(
            f"--dataset {args.dataset!r} lists files twice: files stands for every "
            "--train-src/--train-tgt pair, give it once"
        )
    src, tgt = split_list(args.train_src), split_list(args.train_tgt)
    if "files" in kinds and src and tgt and len(src) != len(tgt):
        raise ConfigError(
            f"--train-tgt lists {len(tgt)} files and --train-src {len(src)}: give one target "
            "file per source file, in the same order"
        )
    if "files" in kinds and any(not name for name in src + tgt):
        raise ConfigError("--train-src/--train-tgt has an empty file name: remove the extra comma")
    if "files" in kinds and not (src and tgt):  # before TensorFlow loads, not at the reading
        raise ConfigError("--dataset files needs the train files: pass --train-src and --train-tgt")
    corpora = []
    for kind in kinds:
        corpora += (
            [("files", pair) for pair in zip(src, tgt)] if kind == "files" else [(kind, None)]
        )
    check_weights_and_tags(args, len(corpora))
    weights = tuple(float(w) for w in split_list(args.train_weights)) or None
    tagged = tuple(sorted({int(t) - 1 for t in split_list(args.tag_corpus)}))
    return Corpora(tuple(corpora), weights, tagged)


def check_weights_and_tags(args: TrainArgs, count: int) -> None:
    weights = split_list(args.train_weights)
    if weights and count == 1:
        raise ConfigError("--train-weights needs several training corpora; --dataset gives one")
    if weights and len(weights) != count:
        raise ConfigError(
            f"--train-weights has {len(weights)} weights for {count} training corpora: give "
            "one weight per corpus, in the order of --dataset/--train-src"
        )
    for weight in weights:
        try:
            ok = math.isfinite(float(weight)) and float(weight) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"--train-weights: {weight!r} is not a positive number")
    tags = split_list(args.tag_corpus)
    if tags and count == 1:
        raise ConfigError("--tag-corpus needs several training corpora; --dataset gives one")
    for tag in tags:
        if not tag.isdigit() or not 1 <= int(tag) <= count:
            raise ConfigError(
                f"--tag-corpus: {tag!r} is not the 1-based index of one of the {count} "
                "training corpora"
            )


__all__ = ["Corpora", "parse_corpora", "split_list"]
