"""`DecodingOptions`: the options of a beam search, one frozen object with the paper's defaults
and its checks (no TensorFlow).

The `Translator`, kt-export, the inference commands (kt-translate, kt-evaluate) and the
validation BLEU of kt-train all take one `DecodingOptions`; the export writes its own as
`assets/decoding.json`, where the inference commands read the defaults of the options they
are not given. The sampling options (`check_sampling`) are per request and have no object.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from keras_transformer.config import (
    ALPHA,
    BEAM_SIZE,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
    STOP_RULE,
    STOP_RULES,
)
from keras_transformer.errors import KerasTransformerError

# per-request bounds: a request cannot ask for unbounded memory or time
MAX_BEAM_SIZE = 64
MAX_EXTRA_LENGTH_LIMIT = 1024  # the largest max_extra_length (the default is config's)
# an export's options, in its assets/ (`write_options`, `read_options`)
OPTIONS_FILE = "decoding.json"


class DecodingOptionsError(KerasTransformerError, ValueError):
    """A decoding option out of range; the message names the option and the value, and
    `option` holds its name (command lines map it to their flag)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option} {message}")
        self.option = option


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    """How a beam search decodes; the defaults are the paper's (section 6.1).

    Args:
        beam_size: K, in [1, MAX_BEAM_SIZE] (paper: 4); 1 with alpha 0 is greedy search.
        alpha: the GNMT length penalty's exponent, finite and >= 0 (paper: 0.6).
        max_extra_length: outputs may be this many tokens longer than the input, in
            [1, MAX_EXTRA_LENGTH_LIMIT] (paper: 50).
        min_length: shortest translation of a non-empty input, in tokens before eos, >= 0
            (default 1, as CTranslate2, fairseq and OpenNMT; 0: none, as the paper).
        stop_rule: when the search settles a sentence, one of config.STOP_RULES ("exact":
            the n best equal the exhaustive search's; see `search.beam_search`).
        num_hypotheses: the hypotheses a caller keeps, in [1, beam_size] (the inference
            commands keep 1; the `Translator`'s signatures say their own).
    """

    beam_size: int = BEAM_SIZE
    alpha: float = ALPHA
    max_extra_length: int = MAX_EXTRA_LENGTH
    min_length: int = MIN_LENGTH
    stop_rule: str = STOP_RULE
    num_hypotheses: int = 1

    def __post_init__(self):
        check_options(self.beam_size, self.alpha, self.max_extra_length)
        check_min_length(self.min_length)
        check_stop_rule(self.stop_rule)
        if not _is_int(self.num_hypotheses) or not 1 <= self.num_hypotheses <= self.beam_size:
            raise DecodingOptionsError(
                "num_hypotheses", f"must be in [1, beam_size {self.beam_size}], got "
                f"{self.num_hypotheses!r}",
            )  # fmt: skip

    def given(self, **values) -> DecodingOptions:
        """A copy with the values that are not None replaced (and checked)."""
        return dataclasses.replace(self, **{k: v for k, v in values.items() if v is not None})

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> DecodingOptions:
        """The options named in `values` (the others at their defaults), checked; a name
        that is no option is a DecodingOptionsError."""
        names = {field.name for field in dataclasses.fields(cls)}
        for name in values:
            if name not in names:
                raise DecodingOptionsError(name, f"is no decoding option ({', '.join(names)})")
        return cls(**values)

    def describe(self) -> str:
        """One line: `beam 4, alpha 0.6, max extra length 50, min length 1, stop rule
        exact`."""
        return (
            f"beam {self.beam_size}, alpha {self.alpha:g}, max extra length "
            f"{self.max_extra_length}, min length {self.min_length}, stop rule {self.stop_rule}"
        )


def one_object(options: DecodingOptions | None, loose: dict) -> DecodingOptions:
    """`options`, or the options given one by one in `loose` (checked), for a caller that
    takes both (`Translator`); a value of `loose` other than its default beside `options` is
    a ValueError."""
    if options is None:
        return DecodingOptions(**loose)
    defaults = DecodingOptions()
    changed = sorted(k for k, v in loose.items() if v != getattr(defaults, k))
    if changed:
        raise ValueError(f"give {', '.join(changed)} in `options`, not beside it")
    return options


def write_options(directory: str, options: DecodingOptions) -> str:
    """`options` as `<directory>/decoding.json` (an export's assets/); its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, OPTIONS_FILE)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(options.as_dict(), handle, indent=2)
        handle.write("\n")
    return path


def read_options(directory: str) -> DecodingOptions | None:
    """The options of `<directory>/decoding.json`; None when there is no such file (an export
    made before 0.3). Raises KerasTransformerError naming the file when it holds no options."""
    path = os.path.join(directory, OPTIONS_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            values = json.load(handle)
        if not isinstance(values, dict):
            raise ValueError("not a JSON object")
        return DecodingOptions.from_dict(values)
    except (ValueError, TypeError) as err:  # DecodingOptionsError is a ValueError
        raise KerasTransformerError(f"{path} holds no decoding options: {err}") from None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(beam_size: int, alpha: float, max_extra_length: int) -> None:
    """Raise `DecodingOptionsError` naming the first option out of range."""
    if not 1 <= beam_size <= MAX_BEAM_SIZE:
        raise DecodingOptionsError("beam_size", f"must be in [1, {MAX_BEAM_SIZE}], got {beam_size}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise DecodingOptionsError("alpha", f"must be a finite number >= 0, got {alpha}")
    if not 1 <= max_extra_length <= MAX_EXTRA_LENGTH_LIMIT:
        raise DecodingOptionsError(
            "max_extra_length",
            f"must be in [1, {MAX_EXTRA_LENGTH_LIMIT}], got {max_extra_length}",
        )


def check_stop_rule(stop_rule: str) -> None:
    """Raise `DecodingOptionsError` unless `stop_rule` names one of config.STOP_RULES."""
    if stop_rule not in STOP_RULES:
        raise DecodingOptionsError(
            "stop_rule", f"must be one of {', '.join(STOP_RULES)}, got {stop_rule!r}"
        )


def check_min_length(min_length: int) -> None:
    """Raise `DecodingOptionsError` unless `min_length` is an integer >= 0."""
    if not _is_int(min_length) or min_length < 0:
        raise DecodingOptionsError("min_length", f"must be an integer >= 0, got {min_length!r}")


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Raise `DecodingOptionsError` naming the first sampling option out of range."""
    if not (math.isfinite(temperature) and temperature > 0):
        raise DecodingOptionsError("temperature", f"must be a finite number > 0, got {temperature}")
    if top_k < 0:
        raise DecodingOptionsError("top_k", f"must be >= 0 (0: no limit), got {top_k}")
    if not 0 < top_p <= 1:
        raise DecodingOptionsError("top_p", f"must be in (0, 1], got {top_p}")
