"""Read an OPUS-MT / Marian Transformer from its own files, in either layout it is published in.

- A Marian model directory (what OPUS-MT's zips hold): `decoder.yml` (naming the model `.npz`
  and the vocabulary `.yml`), the `.npz` (Marian's weight names, and `special:model.yml`, the
  options it was trained with), the vocabulary `.yml`, `source.spm` and `target.spm`.
- A Hugging Face Marian directory (`Helsinki-NLP/opus-mt-*`): `config.json`,
  `model.safetensors` (read with the `safetensors` package into numpy, no PyTorch),
  `vocab.json`, `source.spm` and `target.spm`.

Either becomes one `MarianCheckpoint`: the options as a `TransformerConfig`, the weights under
Marian's names (a Hugging Face checkpoint is renamed to them), the vocabulary in Marian's id
order (`</s>` 0, `<unk>` 1) and the two SentencePiece models. `importers.run` turns it into a
run directory. Everything is checked before anything is written: a missing file, an `.npz`
without `special:model.yml`, an option this Transformer does not have (named, as Marian's
flag or Hugging Face's config key) or a vocabulary that does not match the embedding raise
`ImportFailure`, which the command prints as one line (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

from keras_transformer.config import TransformerConfig
from keras_transformer.errors import KerasTransformerError

MARIAN_FORMAT, HF_FORMAT = "marian", "huggingface"
SPM_FILES = ("source.spm", "target.spm")
# the inputs an import reads longest (truncation of longer ones: the translator's); Marian
# itself crops at --max-length (its decoder.yml default: 1000 with --max-length-crop)
MAX_LENGTH = 512
# Marian's layer normalization epsilon (marian's layerNorm(..., eps = 1e-9))
MARIAN_EPSILON = 1e-9
ACTIVATIONS = {  # Marian's --transformer-ffn-activation -> ours
    "relu": "relu",
    "swish": "swish",
    "gelu": "gelu_sigmoid",  # Marian's gelu is x sigmoid(1.702 x)
}
HF_ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
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


class ImportFailure(KerasTransformerError, ValueError):
    """A source directory that cannot be imported; the message names the file or option."""


@dataclasses.dataclass
class MarianCheckpoint:
    """One Marian Transformer, whatever layout it came in."""

    config: TransformerConfig
    weights: dict[str, np.ndarray]  # Marian's names and shapes
    vocab: list[str]  # the pieces in Marian's id order: </s> 0, <unk> 1, ...
    source_spm: bytes
    target_spm: bytes
    origin: dict  # {"format": ..., "source": the directory}


def detect(source_dir: str) -> str:
    """MARIAN_FORMAT or HF_FORMAT, from the directory's files."""
    if not os.path.isdir(source_dir):
        raise ImportFailure(f"{source_dir} is not a directory: give an OPUS-MT model directory")
    names = set(os.listdir(source_dir))
    if "decoder.yml" in names or any(n.endswith(".npz") for n in names):
        return MARIAN_FORMAT
    if "config.json" in names:
        return HF_FORMAT
    raise ImportFailure(
        f"{source_dir} is neither a Marian model directory (decoder.yml, model .npz, "
        "vocabulary .yml, source.spm, target.spm) nor a Hugging Face Marian directory "
        "(config.json, model.safetensors, vocab.json, source.spm, target.spm)"
    )


def read(source_dir: str) -> MarianCheckpoint:
    """The model in `source_dir`, in either layout (see the module docstring)."""
    source_dir = os.fspath(source_dir)
    kind = detect(source_dir)
    checkpoint = read_marian(source_dir) if kind == MARIAN_FORMAT else read_huggingface(source_dir)
    check_vocabulary(checkpoint, source_dir)
    return checkpoint


# -- Marian's own files ---------------------------------------------------------------------


def _file(source_dir: str, name: str, what: str) -> str:
    path = os.path.join(source_dir, name)
    if not os.path.isfile(path):
        raise ImportFailure(f"{path} not found: {what}")
    return path


def _yaml(path: str):
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ImportFailure(f"{path} is not a readable YAML file ({first})") from None


def _spm(source_dir: str) -> tuple[bytes, bytes]:
    protos = []
    for name in SPM_FILES:
        path = _file(source_dir, name, "OPUS-MT models ship their SentencePiece models with them")
        with open(path, "rb") as handle:
            protos.append(handle.read())
    return protos[0], protos[1]


def read_marian(source_dir: str) -> MarianCheckpoint:
    decoder_yml = _file(source_dir, "decoder.yml", "it names the model .npz and the vocabulary")
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
    npz = _file(source_dir, os.path.basename(models[0]), f"{decoder_yml} names it")
    vocab = read_vocab_yml(
        _file(source_dir, os.path.basename(vocabs[0]), f"{decoder_yml} names it")
    )
    weights, options = read_npz(npz)
    config = config_from_marian(options, weights, npz)
    source_spm, target_spm = _spm(source_dir)
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


def config_from_marian(options: dict, weights: dict, where: str) -> TransformerConfig:
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
    heads = options.get("transformer-heads", 8)
    return _config(
        vocab=weights["Wemb"].shape[0],
        d_model=options.get("dim-emb", weights["Wemb"].shape[1]),
        d_ff=options.get("transformer-dim-ffn", 2048),
        heads=heads,
        encoder_layers=options.get("enc-depth", 6),
        decoder_layers=options.get("dec-depth", 6),
        activation=ACTIVATIONS[activation],
        where=where,
    )


def _config(*, vocab, d_model, d_ff, heads, encoder_layers, decoder_layers, activation, where):
    from keras_transformer.config import ConfigError

    try:
        return TransformerConfig(
            vocab_size=int(vocab) + 2,  # pad and bos join Marian's ids (see run.py)
            num_layers=int(encoder_layers),
            decoder_layers=int(decoder_layers),
            d_model=int(d_model),
            d_ff=int(d_ff),
            num_heads=int(heads),
            dropout_rate=0.1,
            max_length=MAX_LENGTH,
            layer_norm_epsilon=MARIAN_EPSILON,
            ffn_activation=activation,
            output_bias=True,
            sinusoid_layout="halves",
            decoder_start_zero=True,
        )
    except (ConfigError, TypeError, ValueError) as err:
        raise ImportFailure(f"{where}: {err}") from None


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


# -- Hugging Face's layout ------------------------------------------------------------------


def read_huggingface(source_dir: str) -> MarianCheckpoint:
    config_path = _file(source_dir, "config.json", "a Hugging Face model directory has one")
    try:
        with open(config_path, encoding="utf-8") as handle:
            hf = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ImportFailure(f"{config_path} is not valid JSON ({err})") from None
    if hf.get("model_type") != "marian":
        raise ImportFailure(
            f"{config_path}: model_type {hf.get('model_type')!r} is not supported (only 'marian')"
        )
    for key, allowed in (
        ("normalize_before", False),
        ("normalize_embedding", False),
        ("add_final_layer_norm", False),
        ("scale_embedding", True),
        ("share_encoder_decoder_embeddings", True),
        ("static_position_embeddings", True),
    ):
        if key in hf and hf[key] != allowed:
            raise ImportFailure(f"{config_path}: {key} {hf[key]!r} is not supported")
    for enc, dec in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf.get(enc) != hf.get(dec):
            raise ImportFailure(f"{config_path}: {enc} and {dec} differ, which is not supported")
    activation = hf.get("activation_function", "swish")
    if activation not in HF_ACTIVATIONS:
        raise ImportFailure(
            f"{config_path}: activation_function {activation!r} is not supported "
            f"(only {', '.join(HF_ACTIVATIONS)})"
        )
    tensors_path = _file(source_dir, "model.safetensors", "the weights (read without PyTorch)")
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ImportFailure(
            "reading model.safetensors needs the safetensors package: pip install safetensors"
        ) from None
    try:
        tensors = load_file(tensors_path)
    except Exception as err:  # safetensors raises its own error types
        raise ImportFailure(f"{tensors_path} is not a readable safetensors file ({err})") from None
    pad = hf.get("pad_token_id")
    shared = tensors.get("model.shared.weight")
    if shared is None:
        raise ImportFailure(f"{tensors_path} has no model.shared.weight (the shared embedding)")
    if pad != shared.shape[0] - 1:
        raise ImportFailure(
            f"{config_path}: pad_token_id {pad!r} is not the last row of the embedding "
            f"({shared.shape[0] - 1}), as OPUS-MT's conversion writes it"
        )
    vocab = read_vocab_json(_file(source_dir, "vocab.json", "the shared vocabulary"))
    if vocab[pad:] != ["<pad>"]:
        raise ImportFailure(f"{source_dir}/vocab.json: id {pad} (pad_token_id) must be <pad>")
    weights = marian_names(tensors, hf, tensors_path)
    config = _config(
        vocab=pad,
        d_model=hf.get("d_model", shared.shape[1]),
        d_ff=hf.get("encoder_ffn_dim", 2048),
        heads=hf.get("encoder_attention_heads", 8),
        encoder_layers=hf.get("encoder_layers", 6),
        decoder_layers=hf.get("decoder_layers", 6),
        activation=HF_ACTIVATIONS[activation],
        where=config_path,
    )
    source_spm, target_spm = _spm(source_dir)
    origin = {"format": HF_FORMAT, "source": os.path.abspath(source_dir)}
    return MarianCheckpoint(config, weights, vocab[:pad], source_spm, target_spm, origin)


def read_vocab_json(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            mapping = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ImportFailure(f"{path} is not valid JSON ({err})") from None
    if not isinstance(mapping, dict) or sorted(mapping.values()) != list(range(len(mapping))):
        raise ImportFailure(f"{path} must map each piece to one id, 0 ... N-1 each once")
    return [piece for piece, _ in sorted(mapping.items(), key=lambda item: item[1])]


def marian_names(tensors: dict, hf: dict, where: str) -> dict[str, np.ndarray]:
    """Hugging Face's Marian state dict -> Marian's names, shapes and dtypes (float32):
    Linear weights (out, in) transposed to Marian's (in, out), biases and norms (1, d)."""
    pad = hf["pad_token_id"]

    def get(name):
        if name not in tensors:
            raise ImportFailure(f"{where} has no {name}")
        return np.asarray(tensors[name], np.float32)

    out = {
        "Wemb": get("model.shared.weight")[:pad],
        "decoder_ff_logit_out_b": get("final_logits_bias")[:, :pad].reshape(1, -1),
    }
    projections = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}

    def attention(ours, theirs):
        for m, h in projections.items():
            out[f"{ours}_W{m}"] = get(f"{theirs}.{h}.weight").T
            out[f"{ours}_b{m}"] = get(f"{theirs}.{h}.bias")[None, :]

    def norm(ours, theirs):
        out[f"{ours}_ln_scale"] = get(f"{theirs}.weight")[None, :]
        out[f"{ours}_ln_bias"] = get(f"{theirs}.bias")[None, :]

    def ffn(ours, theirs):
        for k in ("1", "2"):
            out[f"{ours}_W{k}"] = get(f"{theirs}.fc{k}.weight").T
            out[f"{ours}_b{k}"] = get(f"{theirs}.fc{k}.bias")[None, :]
        norm(f"{ours}_ffn", f"{theirs}.final_layer_norm")

    for i in range(hf.get("encoder_layers", 6)):
        ours, theirs = f"encoder_l{i + 1}", f"model.encoder.layers.{i}"
        attention(f"{ours}_self", f"{theirs}.self_attn")
        norm(f"{ours}_self_Wo", f"{theirs}.self_attn_layer_norm")
        ffn(f"{ours}_ffn", theirs)
    for i in range(hf.get("decoder_layers", 6)):
        ours, theirs = f"decoder_l{i + 1}", f"model.decoder.layers.{i}"
        attention(f"{ours}_self", f"{theirs}.self_attn")
        norm(f"{ours}_self_Wo", f"{theirs}.self_attn_layer_norm")
        attention(f"{ours}_context", f"{theirs}.encoder_attn")
        norm(f"{ours}_context_Wo", f"{theirs}.encoder_attn_layer_norm")
        ffn(f"{ours}_ffn", theirs)
    return out


# -- checks common to both ------------------------------------------------------------------


def check_vocabulary(checkpoint: MarianCheckpoint, source_dir: str) -> None:
    rows = checkpoint.weights["Wemb"].shape[0]
    if len(checkpoint.vocab) != rows:
        raise ImportFailure(
            f"{source_dir}: the vocabulary has {len(checkpoint.vocab)} pieces but the "
            f"embedding has {rows} rows: the vocabulary is not this model's"
        )
    if checkpoint.vocab[:2] != ["</s>", "<unk>"]:
        raise ImportFailure(
            f"{source_dir}: the vocabulary must start with </s> (id 0) and <unk> (id 1), as "
            f"Marian writes it, got {checkpoint.vocab[:2]}"
        )
