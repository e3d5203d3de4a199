import pytest

from keras_transformer import TransformerConfig


def test_presets_follow_table_3():
    base = TransformerConfig.preset("base")
    big = TransformerConfig.preset("big")
    assert (base.num_layers, base.d_model, base.d_ff, base.num_heads, base.dropout_rate) == (
        6,
        512,
        2048,
        8,
        0.1,
    )
    assert (big.num_layers, big.d_model, big.d_ff, big.num_heads, big.dropout_rate) == (
        6,
        1024,
        4096,
        16,
        0.3,
    )
    assert base.label_smoothing == 0.1 and not base.norm_first and base.positional == "sinusoidal"


def test_overrides_and_json_round_trip():
    cfg = TransformerConfig.preset("small", vocab_size=8000, norm_first=True)
    assert cfg.vocab_size == 8000 and cfg.norm_first and cfg.d_model == 256
    assert TransformerConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"d_model": 30, "num_heads": 4}, "divisible"),
        ({"dropout_rate": 1.2}, "dropout_rate"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"positional": "rotary"}, "positional"),
    ],
)
def test_invalid_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**kwargs)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="unknown preset"):
        TransformerConfig.preset("huge")
    with pytest.raises(ValueError, match="hidden_size"):
        TransformerConfig.from_dict({"hidden_size": 3})
