"""A Marian model directory, as OPUS-MT's zips hold it: `decoder.yml` (naming the model `.npz`
and the vocabulary `.yml`), the `.npz` (Marian's weight names, and `special:model.yml`, the
options it was trained with), the vocabulary `.yml`, `source.spm` and `target.spm`.

An option this Transformer does not have stops the import with Marian's flag named.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from keras_transformer.importers.checkpoint import (
    MARIAN_FORMAT,
    ImportFailure,
    MarianCheckpoint,
    model_config,
    read_spm,
    source_file,
)

ACTIVATIONS = {  # Marian's --transformer-ffn-activation -> ours
    "relu": "relu",
    "swish": "swish",
    "gelu": "gelu_sigmoid",  # Marian's gelu is x sigmoid(1.702 x)
}
# Marian options that must have these values (the Transformer this package builds)
REQUIRED = {
    "type": ("transformer",),
    "transformer-decoder-autoreg": ("self-attention",),
    "transformer-preprocess": ("",),
    "transformer-postprocess": ("dan",),
    "transformer-postprocess-emb": ("d",),
    "transformer-postprocess-top": ("",),
    "transformer-ffn-depth": (2,),
    "transformer-decoder-ffn-depth": (0, 2),
    "transformer-no-projection": (False,),
    "transformer-train-position-embeddings": (False,),
    "tied-embeddings-all": (True,),
    "right-left": (False,),
}


def _yaml(path: str):
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ImportFailure(f"{path} is not a readable YAML file ({first})") from None


def _model_files(source_dir: str) -> tuple[str, str]:
    """(the .npz, the vocabulary .yml) that decoder.yml names."""
    decoder_yml = source_file(
        source_dir, "decoder.yml", "it names the model .npz and the vocabulary"
    )
    decoder = _yaml(decoder_yml)
    models = decoder.get("models") if isinstance(decoder, dict) else None
    vocabs = decoder.get("vocabs") if isinstance(decoder, dict) else None
    if not models or not vocabs:
        raise ImportFailure(f"{decoder_yml} must list `models:` (the .npz) and `vocabs:`")
    if len(models) != 1:
        raise ImportFailure(f"{decoder_yml}: `models:` lists {len(models)} models (an ensemble)")
    if len(set(vocabs)) != 1:
        raise ImportFailure(
            f"{decoder_yml}: `vocabs:` names separate source and target vocabularies; only "
            "models with one shared vocabulary (--tied-embeddings-all) are imported"
        )
    named = f"{decoder_yml} names it"
    return (
        source_file(source_dir, os.path.basename(models[0]), named),
        source_file(source_dir, os.path.basename(vocabs[0]), named),
    )


def read_marian(source_dir: str) -> MarianCheckpoint:
    npz, vocab_yml = _model_files(source_dir)
    vocab = read_vocab_yml(vocab_yml)
    weights, options = read_npz(npz)
    config = config_from_marian(options, weights, npz)
    source_spm, target_spm = read_spm(source_dir)
    origin = {"format": MARIAN_FORMAT, "source": os.path.abspath(source_dir)}
    return MarianCheckpoint(config, weights, vocab, source_spm, target_spm, origin)


def read_npz(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """(weights by Marian's name, the options of `special:model.yml`)."""
    try:
        with np.load(path) as archive:
            weights = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as err:
        raise ImportFailure(f"{path} is not a readable .npz file ({err})") from None
    if "special:model.yml" not in weights:
        raise ImportFailure(
            f"{path} has no special:model.yml (the options the model was trained with): "
            "give the .npz that Marian wrote, not a converted one"
        )
    import yaml

    raw = weights.pop("special:model.yml")
    try:
        options = yaml.safe_load(raw.tobytes().rstrip(b"\0").decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError):
        options = None
    if not isinstance(options, dict):
        raise ImportFailure(f"{path}: special:model.yml is not a YAML mapping of options")
    return weights, options


def config_from_marian(options: dict, weights: dict, where: str):
    """The TransformerConfig of Marian's options; ImportFailure names the first option that
    this Transformer does not have."""
    for name, allowed in REQUIRED.items():
        value = options.get(name, allowed[0])
        if value not in allowed:
            shown = " or ".join(repr(a) for a in allowed)
            raise ImportFailure(
                f"{where}: Marian option --{name} {value!r} is not supported (only {shown})"
            )
    if options.get("transformer-tied-layers"):
        raise ImportFailure(f"{where}: Marian option --transformer-tied-layers is not supported")
    activation = options.get("transformer-ffn-activation", "swish")
    if activation not in ACTIVATIONS:
        raise ImportFailure(
            f"{where}: Marian option --transformer-ffn-activation {activation!r} is not "
            f"supported (only {', '.join(ACTIVATIONS)})"
        )
    if "Wemb" not in weights:
        raise ImportFailure(f"{where} has no Wemb (the shared embedding) weight")
    return model_config(
        vocab=weights["Wemb"].shape[0],
        d_model=options.get("dim-emb", weights["Wemb"].shape[1]),
        d_ff=options.get("transformer-dim-ffn", 2048),
        heads=options.get("transformer-heads", 8),
        encoder_layers=options.get("enc-depth", 6),
        decoder_layers=options.get("dec-depth", 6),
        activation=ACTIVATIONS[activation],
        where=where,
    )


def read_vocab_yml(path: str) -> list[str]:
    """Marian's vocabulary .yml (`piece: id` lines) -> the pieces in id order.

    Read line by line rather than with a YAML parser: Marian writes keys that a parser
    rewrites or drops (`"\\x00"`, `? ` complex keys, pieces such as `yes`, `null`)."""
    entries: dict[int, str] = {}
    pending = None
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if line.startswith("? "):
                pending = line[2:]
                continue
            if pending is not None:
                piece, value = pending, line.lstrip(": ").strip()
                pending = None
            else:
                piece, sep, value = line.rpartition(":")
                if not sep:
                    raise ImportFailure(f"{path}:{number}: expected `piece: id`, got {line!r}")
            try:
                index = int(value.strip())
            except ValueError:
                raise ImportFailure(f"{path}:{number}: {value.strip()!r} is not an id") from None
            entries[index] = _unquote(piece)
    if sorted(entries) != list(range(len(entries))):
        raise ImportFailure(f"{path}: the ids are not 0 ... {len(entries) - 1} each once")
    return [entries[i] for i in range(len(entries))]


def _unquote(token: str) -> str:
    if len(token) >= 2 and token[0] == token[-1] == '"':
        return json.loads(re.sub(r"\\x([0-9a-fA-F]{2})", r"\\u00\1", token))
    if len(token) >= 2 and token[0] == token[-1] == "'":
        return token[1:-1].replace("''", "'")
    return token


__all__ = ["ACTIVATIONS", "REQUIRED", "read_marian", "read_npz", "read_vocab_yml"]
