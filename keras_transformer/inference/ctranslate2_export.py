"""`kt-export --format ctranslate2`: our weights in a CTranslate2 model, and a decoder over it
with our translator's settings, for the agreement report.

Needs the optional extra (`pip install -e ".[ctranslate2]"`); ctranslate2 (and TensorFlow)
are imported inside the functions only, so the package never imports ctranslate2 unless this
export is asked for, and a benchmark's CTranslate2 worker never starts TensorFlow.

The conversion writes the `Transformer`'s weights, as they are (`ctranslate2.specs`): fused
Q/K/V and K/V projections, the tied embedding as the output projection (bias 0), our
sinusoidal table (sin and cos interleaved, not CTranslate2's halves) as explicit position
encodings, our layer-norm epsilon, and eos appended to every source (as our translator
does). Learned positions are not converted.

What CTranslate2 does differently, at the same beam size and alpha (so outputs may differ
from the SavedModel's; the agreement report counts how many): its length penalty divides
by length ** alpha (ours: the GNMT ((5 + length) / 6) ** alpha), it stops a sentence once
beam_size hypotheses finished among the top beam_size candidates (our --stop-rule finished)
and only those eos enter its finished list (ours: among the 2 x beam_size); with beam 1 and
alpha 0 (greedy) the two give the same outputs.
"""

from __future__ import annotations

import os

import numpy as np

from keras_transformer.settings.export_args import ExportArgs, ExportError

TOKENIZER_FILE = "spm.model"
RESERVED_IDS = 4  # config.RESERVED_IDS


def _linear(layer, kernel, bias) -> None:
    layer.weight = np.ascontiguousarray(np.asarray(kernel, np.float32).T)  # (out, in)
    layer.bias = np.asarray(bias, np.float32)


def _norm(layer, keras_norm) -> None:
    layer.gamma = np.asarray(keras_norm.gamma, np.float32)
    layer.beta = np.asarray(keras_norm.beta, np.float32)


def _attention(spec, block) -> None:
    """One of our Residual(MultiHeadAttention) blocks into a CTranslate2 attention spec."""
    mha = block.sublayer
    _norm(spec.layer_norm, block.norm)
    if mha.self_attention:  # ours: [Q | K | V], heads contiguous in each; CTranslate2 too
        _linear(spec.linear[0], mha.qkv_kernel, mha.qkv_bias)
        _linear(spec.linear[1], mha.output_kernel, mha.output_bias)
    else:
        _linear(spec.linear[0], mha.q_kernel, mha.q_bias)
        _linear(spec.linear[1], mha.kv_kernel, mha.kv_bias)  # [K | V] of the memory
        _linear(spec.linear[2], mha.output_kernel, mha.output_bias)


def _feed_forward(spec, block) -> None:
    ffn = block.sublayer
    _norm(spec.layer_norm, block.norm)
    _linear(spec.linear_0, ffn.inner_kernel, ffn.inner_bias)
    _linear(spec.linear_1, ffn.output_kernel, ffn.output_bias)


def write_ctranslate2(
    model,
    tokens: list[str],
    out_dir: str,
    max_positions: int = 1024,
    source_eos: bool = True,
    quantization: str = "float32",
) -> None:
    """Write `model` (a built `keras_transformer.Transformer`, sinusoidal positions, biases
    on) as a CTranslate2 model in `out_dir`, with `tokens` (id order) as both vocabularies,
    its weights stored in `quantization` (one of `settings.export_args.QUANTIZATIONS`;
    CTranslate2 may convert again at load time, compute_type). `source_eos`: CTranslate2
    appends eos to every source, as our translator does."""
    if model.config.positional != "sinusoidal":
        raise ValueError("only sinusoidal positions are converted")
    spec = _empty_spec(model.config, source_eos)
    _embeddings(spec, model, max_positions)
    for layer, ours in zip(spec.encoder.layer, model.encoder.blocks, strict=True):
        _attention(layer.self_attention, ours.self_attention)
        _feed_forward(layer.ffn, ours.feed_forward)
    for layer, ours in zip(spec.decoder.layer, model.decoder.blocks, strict=True):
        _attention(layer.self_attention, ours.self_attention)
        _attention(layer.attention, ours.cross_attention)
        _feed_forward(layer.ffn, ours.feed_forward)
    if model.config.norm_first:
        _norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _norm(spec.decoder.layer_norm, model.decoder.final_norm)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.validate()
    spec.optimize(quantization=quantization)
    os.makedirs(out_dir, exist_ok=True)
    spec.save(out_dir)


def _empty_spec(cfg, source_eos: bool):
    """A `TransformerSpec` of the shape of `cfg` (a `TransformerConfig`), weights unset."""
    from ctranslate2.specs import common_spec, transformer_spec

    activations = {
        "relu": common_spec.Activation.RELU,
        "swish": common_spec.Activation.SWISH,
        "gelu": common_spec.Activation.GELU,
        "gelu_sigmoid": common_spec.Activation.GELUSigmoid,
    }
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.num_layers, cfg.num_decoder_layers),
        cfg.num_heads,
        pre_norm=cfg.norm_first,
        activation=activations[cfg.ffn_activation],
    )
    spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
    spec.config.add_source_eos = source_eos
    return spec


def _embeddings(spec, model, max_positions: int) -> None:
    """The tied embedding (both sides' inputs and the output projection, with its bias) and
    our sinusoidal table for `max_positions` positions."""
    from keras_transformer.layers.embedding import sinusoid_table

    cfg = model.config
    embedding = np.asarray(model.embedding.embeddings, np.float32)
    positions = sinusoid_table(np.arange(max_positions), cfg.d_model, cfg.sinusoid_layout).numpy()
    for side in (spec.encoder, spec.decoder):
        side.scale_embeddings = True  # x sqrt(d_model), as ours
        side.position_encodings.encodings = positions
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = embedding
    spec.decoder.projection.weight = embedding  # tied, as ours
    bias = model.embedding.bias
    spec.decoder.projection.bias = (
        np.zeros(cfg.vocab_size, np.float32) if bias is None else np.asarray(bias, np.float32)
    )
    spec.decoder.start_from_zero_embedding = cfg.decoder_start_zero


def export_ctranslate2(model, tokenizer, path: str, quantization: str = "float32") -> None:
    """Write `model` and `tokenizer` (a `SubwordTokenizer`) as a CTranslate2 model directory:
    model.bin, config.json, shared_vocabulary.json and spm.model (to tokenize for it)."""
    import sentencepiece

    from keras_transformer.inference.options import MAX_EXTRA_LENGTH_LIMIT

    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.proto)
    tokens = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    # positions for the longest input and the longest output a request may ask for
    positions = model.config.max_length + MAX_EXTRA_LENGTH_LIMIT + 8
    write_ctranslate2(model, tokens, path, max_positions=positions, quantization=quantization)
    with open(os.path.join(path, TOKENIZER_FILE), "wb") as handle:
        handle.write(tokenizer.proto)


class CTranslate2Exporter:
    """--format ctranslate2: a CTranslate2 model directory (`export_ctranslate2`) in the
    same version directories as a SavedModel; models.config is left as it is (TF Serving
    does not run it)."""

    def __init__(self, args: ExportArgs):
        self.args = args
        self.quantization = args.quantization or "float32"

    def check(self) -> None:
        """Raise `ExportError` unless the ctranslate2 package is installed."""
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            raise ExportError(
                '--format ctranslate2 needs the ctranslate2 package: pip install -e ".[ctranslate2]"'
            ) from None

    def check_model(self, model) -> None:
        """Raise `ExportError` for a model CTranslate2's converter cannot take."""
        if model.config.positional != "sinusoidal":
            raise ExportError(
                f"--format ctranslate2 converts sinusoidal positions only; {self.args.model_dir} "
                f"uses {model.config.positional} ones: export it as a SavedModel"
            )

    def described(self) -> dict:
        # CTranslate2's own search: its rule with a length penalty, its penalty
        described = {**self.args.described(), "dtype": None, "stop_rule": "finished"}
        return {**described, "quantization": self.quantization}

    def write(self, translator, path: str) -> None:
        export_ctranslate2(translator.model, translator.tokenizer, path, self.quantization)

    def export(self, translator, agreement) -> str:
        from keras_transformer.inference.export import export_translator

        args = self.args
        return export_translator(
            translator, args.export_dir, model_name=args.model_name, version=args.version,
            agreement=agreement, write=self.write,
        )  # fmt: skip


class Decoder:
    """A CTranslate2 model directory decoded with our translator's settings, with the
    interface of `evaluation.translate_all`'s functions: decoder(inputs=(B,) strings) ->
    {"outputs" (B,) bytes, "scores" (B,) float32 (CTranslate2's own scores)}.

    Sources are cut to `max_input_length` - 1 pieces (eos appended, as ours); a sentence's
    longest output is its source length (eos included) + `max_extra_length` tokens, eos
    included (CTranslate2's max_decoding_length counts the tokens before it, so sentences
    are decoded in groups of the same bound); empty inputs give "" (score 0)."""

    def __init__(
        self,
        path: str,
        *,
        beam_size: int,
        alpha: float,
        max_extra_length: int,
        min_length: int,
        max_input_length: int,
        compute_type: str = "default",
    ):
        import ctranslate2
        import sentencepiece

        self.translator = ctranslate2.Translator(
            path, device="cpu", compute_type=compute_type, inter_threads=1,
            intra_threads=os.cpu_count() or 1,
        )  # fmt: skip
        self.processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(path, TOKENIZER_FILE)
        )
        # pad, unk, bos and eos are not text (as our detokenizer)
        self.reserved = {self.processor.id_to_piece(i) for i in range(RESERVED_IDS)}
        self.settings = dict(
            beam_size=beam_size, length_penalty=alpha, min_decoding_length=min_length
        )
        self.max_extra_length = max_extra_length
        self.max_input_length = max_input_length

    def __call__(self, inputs, **_):
        import tensorflow as tf

        sentences = [s.decode("utf-8", "replace") for s in inputs.numpy()]
        texts, scores = [""] * len(sentences), [0.0] * len(sentences)
        groups: dict[int, list[int]] = {}
        pieces = []
        for i, sentence in enumerate(sentences):
            tokens = self.processor.encode(sentence, out_type=str)[: self.max_input_length - 1]
            pieces.append(tokens)
            if sentence.strip():
                groups.setdefault(len(tokens) + 1 + self.max_extra_length, []).append(i)
        for bound, rows in groups.items():
            results = self.translator.translate_batch(
                [pieces[i] for i in rows], max_decoding_length=bound - 1, return_scores=True,
                **self.settings,
            )  # fmt: skip
            for i, result in zip(rows, results, strict=True):
                tokens = [t for t in result.hypotheses[0] if t not in self.reserved]
                texts[i] = self.processor.decode_pieces(tokens)
                scores[i] = result.scores[0]
        return {
            "outputs": tf.constant(texts),
            "scores": tf.constant(scores, tf.float32),
        }
