"""`ExportArgs`: every kt-export flag, defined once (the export's flag schema).

`kt-export` builds its command line from these fields (help, choices, group, default), and
`inference.export.export_run` takes the object whole. The checks of the values are
`ExportArgs.check`; what needs the run (its weights, its positions) or a package (ctranslate2)
is checked by the exporter of the format, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keras_transformer.config import (
    ALPHA,
    AVERAGE_LAST,
    BEAM_SIZE,
    FINISH_RULE,
    FINISH_RULES,
    MAX_EXTRA_LENGTH,
    MIN_LENGTH,
    STOP_RULE,
    STOP_RULES,
)
from keras_transformer.errors import KerasTransformerError
from keras_transformer.settings.args import flag, option

# the exported model's compute dtypes (variables, logits and scores stay float32)
DTYPES_EXPORT = ("float32", "bfloat16", "float16")
# one exporter each (inference.export.EXPORTERS)
FORMATS = ("savedmodel", "ctranslate2")
# spec.optimize's quantizations (CTranslate2 4.x), --format ctranslate2's weights
QUANTIZATIONS = (
    "float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
    "bfloat16",
)  # fmt: skip
# --xla: the largest request (sentences) the warmup compiles for: serving/batching.config's
# max_batch_size
XLA_MAX_BATCH = 64
# the argument groups of kt-export --help, in order
GROUPS = {
    "run": "the run and where its export goes",
    "search": "the exported search's defaults",
    "output": "what is written",
}


class ExportError(KerasTransformerError, ValueError):
    """A bad export request; the message names the path or flag."""


def export_flag(group: str, default: Any = dataclasses.MISSING, help: str = "", **kw) -> Any:  # noqa: A002
    """A field of `ExportArgs` (`settings.args.flag`) shown in `group` of kt-export --help;
    no default: a required flag."""
    field = flag(default, help, **kw)
    return dataclasses.field(default=default, metadata={**field.metadata, "group": group})


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    """The flags of kt-export; a library caller builds one with the same names."""

    model_dir: str = export_flag(
        "run", help="the training run (config.json, spm.model, checkpoints/)"
    )
    export_dir: str = export_flag("run", help="writes <export-dir>/<model-name>/<version>/")
    model_name: str = export_flag(
        "run", "transformer", "the model's directory and its name in models.config"
    )
    version: int | None = export_flag(
        "run",
        None,
        "the export's version number; without a number: print kt-export's version and exit",
        auto="the next free one",
    )
    average_last: int = export_flag(
        "run", AVERAGE_LAST, "average the last K checkpoints (1: the last one only)"
    )
    best: bool = export_flag("run", False, "export the best-BLEU checkpoint instead")
    no_ema: bool = export_flag(
        "run",
        False,
        "a run trained with --ema-decay: export the raw weights, not their moving average",
    )
    beam_size: int = export_flag("search", BEAM_SIZE, "beam size")
    alpha: float = export_flag("search", ALPHA, "length penalty exponent")
    max_extra_length: int = export_flag(
        "search", MAX_EXTRA_LENGTH, "output may exceed input by this"
    )
    min_length: int = export_flag(
        "search",
        MIN_LENGTH,
        "shortest translation of a non-empty input, in tokens before eos (1: never an empty "
        "one; 0: no minimum, the paper's search)",
    )
    stop_rule: str = export_flag(
        "search",
        STOP_RULE,
        "when beam search settles a sentence (exact: the n best are those of the exhaustive "
        "search; finished: once beam-size hypotheses ended among the top beam-size "
        "candidates, CTranslate2's rule with a length penalty; top: once the best candidate "
        "ended, CTranslate2's rule without one; both faster, may change some outputs); the "
        'default of translate_with_stop_rule\'s per-sentence stop_rule ("")',
        choices=STOP_RULES,
    )
    finish_rule: str = export_flag(
        "search",
        FINISH_RULE,
        "which candidates finish a hypothesis and how it is scored (tensor2tensor: every eos "
        "among the 2 x beam-size best, GNMT length penalty; ctranslate2: CTranslate2's beam "
        "search, for its translations with --stop-rule top at --alpha 0, finished otherwise; "
        "see docs/inference.md); stored in assets/decoding.json",
        choices=FINISH_RULES,
    )
    attention_layer: int | None = export_flag(
        "search",
        None,
        "the decoder layer whose cross-attention `score` returns",
        auto="the penultimate",
    )
    dtype: str = export_flag(
        "output",
        "float32",
        "compute dtype of the exported model (variables, logits and scores stay float32)",
        choices=DTYPES_EXPORT,
    )
    format: str = export_flag(
        "output",
        "savedmodel",
        "savedmodel (TF Serving) or ctranslate2 (a CTranslate2 model directory; needs "
        'pip install -e ".[ctranslate2]"; models.config is left as it is)',
        choices=FORMATS,
    )
    quantization: str | None = export_flag(
        "output",
        None,
        "--format ctranslate2: the weights' type",
        choices=QUANTIZATIONS,
        auto="float32",
    )
    agreement_sentences: int = export_flag(
        "output",
        200,
        "compare the export with the float32 exact-rule search on this many validation "
        "sentences of the run's dataset, in <version>/assets.extra/agreement.json (0: skip)",
    )
    xla: bool = export_flag(
        "output",
        False,
        "beam searches compiled by XLA, in segments: the same outputs, faster; the "
        "server must enable XLA (TF Serving: --xla_cpu_compilation_enabled=true, on a GPU "
        "--xla_gpu_compilation_enabled=true) and --enable_model_warmup (the warmup "
        "requests compile every shape); SavedModel only; default: a graph any TF Serving runs",
    )
    xla_max_batch: int = export_flag(
        "output",
        XLA_MAX_BATCH,
        "with --xla: the largest request, in sentences, the warmup compiles for "
        "(serving/batching.config's max_batch_size); larger ones compile on first use",
    )

    def check(self) -> None:
        """Raise `KerasTransformerError` naming the first flag whose value cannot work, or
        the first two that do not go together; nothing is read but the export dir's parent."""
        from keras_transformer.files import check_writable_dir
        from keras_transformer.inference.options import check_min_length, check_options

        self._check_choices()
        check_writable_dir(self.export_dir, "--export-dir")
        check_options(self.beam_size, self.alpha, self.max_extra_length)
        check_min_length(self.min_length)
        at_least = {"version": 1, "xla_max_batch": 1, "average_last": 1}
        if self.version is None:
            del at_least["version"]
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ExportError(f"{option(name)} must be >= {low}, got {getattr(self, name)}")
        if self.agreement_sentences < 0:
            raise ExportError(
                f"--agreement-sentences must be >= 0 (0: skip), got {self.agreement_sentences}"
            )
        self._check_format()

    def _check_choices(self) -> None:
        for field in dataclasses.fields(self):
            value, choices = getattr(self, field.name), field.metadata["choices"]
            if choices and value is not None and value not in choices:
                raise ExportError(
                    f"{option(field.name)} must be one of {', '.join(choices)}, got {value!r}"
                )

    def _check_format(self) -> None:
        """The flags that apply to one format only."""
        if self.xla and self.format != "savedmodel":
            raise ExportError(
                f"--xla compiles a SavedModel's search; --format {self.format} runs its own: "
                "drop --xla or --format"
            )
        if self.format != "ctranslate2" and self.quantization is not None:
            raise ExportError(
                "--quantization applies to --format ctranslate2 only; use --dtype for a SavedModel"
            )
        if self.format == "ctranslate2" and self.dtype != "float32":
            raise ExportError(
                "--dtype applies to --format savedmodel; use --quantization with --format "
                "ctranslate2"
            )

    def search_settings(self) -> dict:
        """The exported search's defaults, as `Translator` takes them (but the stop rule)."""
        names = ("beam_size", "alpha", "max_extra_length", "min_length", "attention_layer")
        return {name: getattr(self, name) for name in names}

    def described(self) -> dict:
        """The export as its agreement report describes it (`agreement.AgreementReport`)."""
        described = {
            "format": self.format,
            "dtype": self.dtype,
            "stop_rule": self.stop_rule,
            **self.search_settings(),
        }
        if self.xla:
            described["xla"] = True
        if self.finish_rule != FINISH_RULE:
            described["finish_rule"] = self.finish_rule
        return described


def default_text(field: dataclasses.Field) -> str:
    """A flag's default as kt-export --help shows it."""
    if field.metadata.get("auto"):
        return field.metadata["auto"]
    if isinstance(field.default, bool):
        return str(field.default).lower()
    return str(field.default)


__all__ = [
    "DTYPES_EXPORT",
    "FORMATS",
    "QUANTIZATIONS",
    "XLA_MAX_BATCH",
    "ExportArgs",
    "ExportError",
    "default_text",
]
