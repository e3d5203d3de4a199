"""Model configuration: one frozen dataclass and the paper's presets.

The field names are the paper's vocabulary and are the same keyword arguments that the
layers take; `layer_kwargs` is the single place that turns a config into layer arguments.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from keras_transformer.errors import KerasTransformerError

# Paper Table 3. `small` is sized for Multi30k on a CPU; `tiny` is for tests.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(num_layers=2, d_model=64, d_ff=128, num_heads=4, dropout_rate=0.1),
    "small": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout_rate=0.1),
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout_rate=0.1),
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3),
}

POSITIONAL_KINDS = ("sinusoidal", "learned")
# The feed-forward activations: the paper's ReLU; swish (x sigmoid(x)); gelu, the exact
# x Phi(x) (Hugging Face's "gelu"); gelu_sigmoid, x sigmoid(1.702 x) (Marian's "gelu").
FFN_ACTIVATIONS = ("relu", "swish", "gelu", "gelu_sigmoid")
# The sinusoid table's channels: "interleaved" (the paper's PE(pos, 2i) = sin, PE(pos, 2i+1) =
# cos) or "halves" (the d/2 sines then the d/2 cosines of the same frequencies: tensor2tensor,
# Hugging Face's Marian, CTranslate2).
SINUSOID_LAYOUTS = ("interleaved", "halves")
# The special token ids of the one shared vocabulary (SentencePiece is trained with them).
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
RESERVED_IDS = 4

# The paper's decoding (section 6.1): beam 4, length penalty alpha 0.6, outputs up to input
# length + 50; exports average the last 5 checkpoints. Defined here, with no TensorFlow import,
# so that every command's --help and the serving client read the same values.
BEAM_SIZE = 4
ALPHA = 0.6
MAX_EXTRA_LENGTH = 50
# Not the paper's (it sets none): no empty translation of a non-empty source, at least 1 token
# before eos (CTranslate2's min_decoding_length, fairseq's --min-len and OpenNMT's -min_length
# default to 1 too).
MIN_LENGTH = 1
AVERAGE_LAST = 5
# When beam search settles a sentence (inference/search.py): "exact" (the default) stops once no
# live beam can still beat the n-th best finished hypothesis, so the n best equal those of the
# exhaustive search; "finished" also stops once beam_size hypotheses have finished, counting eos
# among the top beam_size candidates of each step only (CTranslate2's rule with a length
# penalty); "top" also stops once the best candidate of a step was eos and n hypotheses have
# finished (CTranslate2's rule without one). Codes in this order.
STOP_RULES = ("exact", "finished", "top")
STOP_RULE = "exact"
# Which hypotheses a beam search step finishes, and how they are scored (inference/beam.py):
# "tensor2tensor" (the default, as tensor2tensor and Model Garden): every eos among the 2K best
# candidates, scored log p / ((5 + length) / 6) ** alpha with eos counted, eos forced at the
# maximum length; "ctranslate2" (CTranslate2's BeamSearch): the eos among the K best only,
# scored log p / length ** alpha (eos counted too), the K best candidates whatever their
# token at the maximum length, log-probabilities renormalized without eos before the minimum
# length. Codes in this order.
FINISH_RULES = ("tensor2tensor", "ctranslate2")
FINISH_RULE = "tensor2tensor"


class ConfigError(KerasTransformerError, ValueError):
    """A TransformerConfig value that cannot work; the message names the field."""


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of an encoder-decoder Transformer.

    Defaults are the paper's base model. Every deviation from the paper is a named field:
    `attention_dropout` and `ffn_dropout` (0 in the paper), `norm_first` (pre-norm; the
    paper is post-norm), `positional` ("learned" is Table 3 row E).

    Args:
        vocab_size: size of the shared source/target vocabulary (V).
        num_layers: N, encoder and decoder layers each.
        d_model: model width.
        d_ff: inner width of the position-wise feed-forward network.
        num_heads: h; `d_model` must be divisible by it unless `d_k` and `d_v` are given.
        d_k: query/key depth per head (Table 3 rows A, B); None means d_model / h.
        d_v: value depth per head (Table 3 row A); None means d_model / h.
        dropout_rate: residual and embedding dropout (paper section 5.4).
        attention_dropout: dropout on attention weights.
        ffn_dropout: dropout after the feed-forward ReLU.
        label_smoothing: epsilon_ls of section 5.4 (used by the loss, not the layers).
        max_length: longest sequence the positional table covers.
        norm_first: pre-norm residual blocks (with a final norm) instead of post-norm.
        positional: "sinusoidal" (section 3.5) or "learned".
        layer_norm_epsilon: epsilon of every LayerNormalization.
        decoder_layers: the decoder's depth when it differs from the encoder's (None: N).
        ffn_activation: the feed-forward activation, one of FFN_ACTIVATIONS (paper: relu).
        output_bias: a bias (V,) added to the output logits (paper: none).
        sinusoid_layout: "interleaved" (the paper's) or "halves" (sines then cosines).
        decoder_start_zero: the decoder's first input (the bos position) is a zero
            embedding instead of bos's row, positions still added (Marian's decoder start).

    The defaults of the last five are the paper's model, and a config that keeps them
    builds the same weights as before they existed (tests/layers/test_saved_layout.py).
    """

    vocab_size: int = 37000
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    dropout_rate: float = 0.1
    attention_dropout: float = 0.0
    ffn_dropout: float = 0.0
    label_smoothing: float = 0.1
    max_length: int = 256
    norm_first: bool = False
    positional: str = "sinusoidal"
    layer_norm_epsilon: float = 1e-6
    decoder_layers: int | None = None
    ffn_activation: str = "relu"
    output_bias: bool = False
    sinusoid_layout: str = "interleaved"
    decoder_start_zero: bool = False

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ConfigError(f"TransformerConfig.{name} {why}, got {getattr(self, name)!r}")

        for name in ("vocab_size", "num_layers", "d_model", "d_ff", "num_heads", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                fail(name, "must be a positive integer")
        if self.vocab_size <= RESERVED_IDS:
            fail("vocab_size", f"must exceed the {RESERVED_IDS} reserved ids (pad, unk, bos, eos)")
        for name in ("d_k", "d_v"):
            value = getattr(self, name)
            if value is None:
                if self.d_model % self.num_heads:
                    raise ConfigError(
                        f"TransformerConfig.d_model ({self.d_model}) must be divisible by "
                        f"num_heads ({self.num_heads}) unless {name} is given"
                    )
            elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                fail(name, "must be a positive integer or None (d_model / num_heads)")
        for name in ("dropout_rate", "attention_dropout", "ffn_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                fail(name, "must be in [0, 1)")
        if not self.layer_norm_epsilon > 0.0:
            fail("layer_norm_epsilon", "must be positive")
        if not isinstance(self.norm_first, bool):
            fail("norm_first", "must be True or False")
        if self.positional not in POSITIONAL_KINDS:
            fail("positional", f"must be one of {POSITIONAL_KINDS}")
        if self.decoder_layers is not None and (
            not isinstance(self.decoder_layers, int)
            or isinstance(self.decoder_layers, bool)
            or self.decoder_layers <= 0
        ):
            fail("decoder_layers", "must be a positive integer or None (num_layers)")
        if self.ffn_activation not in FFN_ACTIVATIONS:
            fail("ffn_activation", f"must be one of {FFN_ACTIVATIONS}")
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            fail("sinusoid_layout", f"must be one of {SINUSOID_LAYOUTS}")
        for name in ("output_bias", "decoder_start_zero"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be True or False")
        if self.positional == "sinusoidal" and self.d_model % 2:
            raise ConfigError(
                f"TransformerConfig.d_model must be even with positional='sinusoidal' "
                f"(sin/cos pairs), got {self.d_model}; use an even d_model or "
                f"positional='learned'"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """The named preset (tiny, small, base, big) with `overrides` applied."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def replace(self, **changes: Any) -> TransformerConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown TransformerConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        return cls.from_dict(json.loads(text))

    @property
    def num_decoder_layers(self) -> int:
        """The decoder's depth: `decoder_layers`, or N when it is None."""
        return self.num_layers if self.decoder_layers is None else self.decoder_layers

    def layer_kwargs(self, part: str = "encoder") -> dict[str, Any]:
        """Keyword arguments of one part of the model (the layers never see this class):
        "encoder" and "decoder" (the stacks: `Encoder`, `Decoder`), "embedding"
        (`SharedEmbedding`) or "positional" (`PositionalEncoding` or
        `LearnedPositionalEmbedding`). An option left at its default is not passed, so the
        layers' configs stay those of the paper's model."""
        if part == "embedding":
            return dict(
                vocab_size=self.vocab_size,
                d_model=self.d_model,
                **({"output_bias": True} if self.output_bias else {}),
            )
        if part == "positional":
            if self.positional == "learned":
                return dict(max_length=self.max_length, d_model=self.d_model)
            layout = self.sinusoid_layout
            return dict(
                d_model=self.d_model, **({"layout": layout} if layout != "interleaved" else {})
            )
        if part not in ("encoder", "decoder"):
            raise ConfigError(f"unknown model part {part!r}")
        activation = self.ffn_activation
        return dict(
            num_layers=self.num_layers if part == "encoder" else self.num_decoder_layers,
            d_model=self.d_model,
            d_ff=self.d_ff,
            num_heads=self.num_heads,
            d_k=self.d_k,
            d_v=self.d_v,
            dropout_rate=self.dropout_rate,
            attention_dropout=self.attention_dropout,
            ffn_dropout=self.ffn_dropout,
            norm_first=self.norm_first,
            layer_norm_epsilon=self.layer_norm_epsilon,
            **({"ffn_activation": activation} if activation != "relu" else {}),
        )
