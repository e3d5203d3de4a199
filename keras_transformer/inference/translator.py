"""Translator: raw strings in, translations and scores out, all in one TensorFlow graph."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer import config
from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.data.tokenizer import SubwordTokenizer
from keras_transformer.inference import forced, search, text, xla_search, xla_shapes
from keras_transformer.inference import options as opt
from keras_transformer.settings.decoding import DecodingOptions, one_object

# kept importable from here: the commands (keras_transformer.cli) name them
DecodingOptionsError = opt.DecodingOptionsError
check_options = opt.check_options
TOKENIZER_DEVICE = text.TOKENIZER_DEVICE


class Translator(tf.Module):
    """Holds the tokenizer and the model; `tf.saved_model.save` exports it whole.

    Args:
        model: a built `Transformer`.
        tokenizer: the `SubwordTokenizer` it was trained with.
        options: its `DecodingOptions` (default: the paper's): the search of `translator` and
            `translate_nbest`; `translate_with_options` and `translate_with_stop_rule` take
            their own per sentence, but `min_length` (every signature's), `finish_rule` and
            `stop_rule` (the default of `translate_with_stop_rule`'s per-sentence one, "").
        beam_size, alpha, max_extra_length, min_length, stop_rule, finish_rule: the options
            one by one (as before `options`), when `options` is not given.
        max_input_length: inputs are truncated to this many tokens, eos included
            (default: the model's `max_length`).
        attention_layer: the decoder layer whose cross-attention `score` returns (default:
            the penultimate, the usual choice for word alignment; negative counts from the
            end).
        xla: run the beam searches (every signature but `sample` and `score`) compiled by
            XLA, in segments (xla_search.py): the same outputs (every stop rule), faster; a
            server must enable XLA (TF Serving: --xla_cpu_compilation_enabled=true) and
            compiles one program per shape (`xla_search.warmup_shapes`). Default False: the
            graph any TensorFlow runs.

    Signatures (every input and output batch-major, B sentences):
      - `translator(inputs)` -> {"outputs" (B,) string, "scores" (B,) float32};
      - `translate_nbest(inputs)` -> {"outputs" (B, K), "scores" (B, K)};
      - `translate_with_options(inputs, beam_size, alpha, max_extra_length, num_hypotheses,
        target_prefix)`, every option (B,) per sentence (0.1.0's inputs, kept as they were:
        a signature never gains an input) -> {"outputs" (B, N), "scores" (B, N)}, N the
        largest num_hypotheses ("" and -inf beyond a sentence's own);
      - `translate_with_stop_rule(...the same..., stop_rule)`: also the stop rule per
        sentence, a name of config.STOP_RULES or "" for the constructor's;
      - `score(inputs, targets)` -> forced decoding of the targets (see `score`);
      - `sample(inputs, temperature, top_k, top_p, seed)` -> {"outputs", "scores"} (B,);
      - with `xla`, `xla_warmup(shapes)`: compiles the search for the given shapes (the
        export's warmup requests call it) -> {"shapes"}.
    Every signature but `xla_warmup` also returns "truncated" (B,) bool: the input was longer
    than `max_input_length` tokens (eos included) and only its beginning was translated
    (scored).
    A sentence's result depends only on itself and its own options. Empty and
    whitespace-only inputs give "" with score 0; invalid UTF-8 bytes are replaced by U+FFFD
    before tokenization; bad option values are InvalidArgument errors naming the input.
    """

    def __init__(
        self,
        model,
        tokenizer: SubwordTokenizer,
        options: DecodingOptions | None = None,
        *,
        beam_size: int = config.BEAM_SIZE,
        alpha: float = config.ALPHA,
        max_extra_length: int = config.MAX_EXTRA_LENGTH,
        max_input_length: int | None = None,
        attention_layer: int | None = None,
        min_length: int = config.MIN_LENGTH,
        stop_rule: str = config.STOP_RULE,
        finish_rule: str = config.FINISH_RULE,
        xla: bool = False,
        name: str = "translator",
    ):
        super().__init__(name=name)
        loose = dict(
            beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length,
            min_length=min_length, stop_rule=stop_rule, finish_rule=finish_rule,
        )  # fmt: skip
        self.options = one_object(options, loose)
        self._stop_code = search.stop_rule_code(self.options.stop_rule)
        self._finish_code = search.finish_rule_code(self.options.finish_rule)
        # the searches count eos in their minimum; None: no minimum
        self._search_min_length = self.options.min_length + 1 if self.options.min_length else None
        self.model = model
        self.tokenizer = tokenizer
        self.max_input_length = max_input_length or model.config.max_length
        # learned positions have a table; sinusoidal ones have no limit
        self.max_output_length = (
            model.config.max_length if model.config.positional == "learned" else None
        )
        layers = model.config.num_decoder_layers
        layer = max(layers - 2, 0) if attention_layer is None else attention_layer
        if not -layers <= layer < layers:
            raise opt.DecodingOptionsError(
                "attention_layer", f"must be in [{-layers}, {layers - 1}], got {layer}"
            )
        self.attention_layer = layer % layers
        self.xla = xla
        self._segmented = None
        if xla:
            self._segmented = xla_search.SegmentedSearch(
                model.decode_step, EOS_ID, grow_cache=model.grow_cache,
                min_length=self._search_min_length,
            )  # fmt: skip

    # as before `options` (the export reads them)
    beam_size = property(lambda self: self.options.beam_size)
    max_extra_length = property(lambda self: self.options.max_extra_length)

    # -- pieces ----------------------------------------------------------------------------

    def _encode_inputs(self, sentences):
        """`text.encode_inputs` with this translator's tokenizer and input length."""
        return text.encode_inputs(self.tokenizer, sentences, self.max_input_length)

    def _detokenize(self, ids, empty):
        return text.detokenize(self.tokenizer, ids, empty)

    def _max_lengths(self, lengths, extra, at_least=None):
        max_lengths = tf.cast(lengths, tf.int32) + extra
        if at_least is not None:
            max_lengths = tf.maximum(max_lengths, at_least)
        if self.max_output_length is not None:
            max_lengths = tf.minimum(max_lengths, self.max_output_length)
        return max_lengths

    def search(
        self, sentences, beam_size, alpha=None, max_extra_length=None, prefix=None,
        num_best=None, stop_rule=None,
    ):  # fmt: skip
        """(B,) strings -> (ids (B, K, L), scores (B, K), empty (B,) bool, truncated (B,)
        bool).

        The options may be Python numbers, scalar tensors or (B,) tensors (default: the
        constructor's); `prefix`: (B,) strings every hypothesis starts with ("" = none);
        `num_best`: the hypotheses the caller keeps, scalar or (B,) (the search stops once
        they are settled, see `search.beam_search`; the others are the best found by then),
        default all K; `stop_rule`: a code of `search` (STOP_EXACT...), scalar or (B,),
        default the constructor's.
        """
        alpha = self.options.alpha if alpha is None else alpha
        extra = self.max_extra_length if max_extra_length is None else max_extra_length
        stop_rule = self._stop_code if stop_rule is None else stop_rule
        source, lengths, empty, truncated = self._encode_inputs(sentences)
        prefix_ids, at_least = None, None
        if prefix is not None:
            ragged = text.cut_targets(self.tokenizer, prefix, self.max_output_length)[0]
            prefix_ids = ragged.to_tensor(default_value=-1)
            at_least = tf.cast(ragged.row_lengths(), tf.int32) + 1  # room for eos
        max_lengths = self._max_lengths(lengths, extra, at_least)
        bos = tf.fill([tf.shape(source)[0]], BOS_ID)
        if self.xla:
            ids, scores = self._xla_search(
                source, bos, max_lengths, beam_size=beam_size, alpha=alpha, prefix=prefix_ids,
                num_best=num_best, stop_rule=stop_rule, finish_rule=self._finish_code,
            )  # fmt: skip
            return ids, scores, empty, truncated
        memory = self.model.encode(source)
        cache = self.model.init_cache(memory, source)
        ids, scores = search.beam_search(
            self.model.decode_step, bos, cache, max_lengths, EOS_ID,
            beam_size=beam_size, alpha=alpha, prefix=prefix_ids, num_best=num_best,
            min_length=self._search_min_length, stop_rule=stop_rule, finish_rule=self._finish_code,
        )  # fmt: skip
        return ids, scores, empty, truncated

    def _xla_search(self, source, bos, max_lengths, **options):
        """`xla_search.SegmentedSearch.beam_search` of (B, S) source ids."""
        # padding masked in every attention: a power of two keeps the compiled shapes few
        width = tf.shape(source)[1]
        bucket = tf.minimum(
            tf.maximum(xla_shapes.next_power_of_two(width), xla_shapes.MIN_SOURCE_WIDTH),
            self.max_input_length,
        )
        source = tf.pad(source, [[0, 0], [0, tf.maximum(bucket - width, 0)]])
        memory = self.model.encode(source)
        cache = self.model.init_cache(memory, source, fixed_capacity=True)
        return self._segmented.beam_search(bos, cache, max_lengths, **options)

    def _nbest(self, ids, scores, empty, truncated):
        return {
            "outputs": self._detokenize(ids, empty),
            "scores": tf.where(empty[:, tf.newaxis], 0.0, scores),
            "truncated": truncated,
        }

    # -- signatures ------------------------------------------------------------------------

    @opt.signature([opt.STRINGS])
    def __call__(self, inputs):
        ids, scores, empty, truncated = self.search(inputs, self.beam_size, num_best=1)
        outputs = self._detokenize(ids[:, :1], empty)[:, 0]
        return {
            "outputs": outputs,
            "scores": tf.where(empty, 0.0, scores[:, 0]),
            "truncated": truncated,
        }

    @opt.signature([opt.STRINGS])
    def translate_nbest(self, inputs):
        return self._nbest(*self.search(inputs, self.beam_size))

    @opt.signature(opt.OPTIONS)
    def translate_with_options(
        self, inputs, beam_size, alpha, max_extra_length, num_hypotheses, target_prefix
    ):
        export_rule = tf.fill(tf.shape(inputs), "")
        return self._with_options(
            "translate_with_options", inputs, beam_size, alpha, max_extra_length,
            num_hypotheses, target_prefix, export_rule,
        )  # fmt: skip

    @opt.signature(opt.STOP_RULE_OPTIONS)
    def translate_with_stop_rule(
        self, inputs, beam_size, alpha, max_extra_length, num_hypotheses, target_prefix, stop_rule
    ):
        return self._with_options(
            "translate_with_stop_rule", inputs, beam_size, alpha, max_extra_length,
            num_hypotheses, target_prefix, stop_rule,
        )  # fmt: skip

    def _with_options(
        self, sig, inputs, beam_size, alpha, max_extra_length, num_hypotheses, target_prefix,
        stop_rule,
    ):  # fmt: skip
        checks = opt.assert_options(
            sig, inputs, beam_size, alpha, max_extra_length, num_hypotheses, target_prefix,
            stop_rule,
        )  # fmt: skip
        beam_size, alpha, max_extra_length, num_hypotheses, stop_rule = opt.checked(
            checks, beam_size, alpha, max_extra_length, num_hypotheses, stop_rule
        )
        ids, scores, empty, truncated = self.search(
            inputs, beam_size, alpha, max_extra_length, target_prefix, num_best=num_hypotheses,
            stop_rule=opt.stop_rule_codes(stop_rule, self._stop_code),
        )  # fmt: skip
        n = tf.maximum(tf.reduce_max(num_hypotheses), 1)
        result = self._nbest(ids[:, :n], scores[:, :n], empty, truncated)
        wanted = tf.range(n)[tf.newaxis, :] < num_hypotheses[:, tf.newaxis]
        return {
            "outputs": tf.where(wanted, result["outputs"], ""),
            "scores": tf.where(wanted, result["scores"], -float("inf")),
            "truncated": truncated,
        }

    @opt.signature([opt.XLA_SHAPES])
    def xla_warmup(self, shapes):
        """With `xla`: compile the search for every row [P, C, S, K, W] of `shapes` (N, 5)
        (`xla_shapes.warmup_shapes`) without decoding anything: {"shapes": `shapes`}, once
        every one is compiled. The export's warmup requests call it, so that a server has
        compiled them before it takes traffic."""
        if not self.xla:
            raise ValueError("xla_warmup needs a Translator(xla=True)")
        return {"shapes": xla_shapes.compile_shapes(self._segmented, self.model, shapes)}

    @opt.signature(opt.SCORE)
    def score(self, inputs, targets):
        """Forced decoding of `targets` given `inputs`, one pass, no search:
        {"scores" (B,) the sum of the target tokens' log-probabilities, eos included;
         "token_scores" (B, T) float32, 0 after eos; "target_tokens" (B, T) string
         SentencePiece pieces, eos last, "" padding; "source_tokens" (B, S) likewise;
         "attention" (B, T, S) float32, the cross-attention of decoder layer
         `attention_layer` averaged over its heads, 0 on padding; "truncated" (B,) bool the
         source was cut to `max_input_length`; "target_truncated" (B,) bool the target was
         cut to the model's positions (learned positions only)}.
        """
        (targets,) = opt.checked(opt.assert_same_length(inputs, targets), targets)
        source, _, _, truncated = self._encode_inputs(inputs)
        ids, target_truncated = text.cut_targets(self.tokenizer, targets, self.max_output_length)
        out = forced.forced_scores(self.model, source, ids, self.attention_layer)
        out["target_tokens"] = text.pieces(self.tokenizer, out.pop("target_out"))
        out["source_tokens"] = text.pieces(self.tokenizer, source)
        return {**out, "truncated": truncated, "target_truncated": target_truncated}

    @opt.signature(opt.SAMPLE)
    def sample(self, inputs, temperature, top_k, top_p, seed):
        """One translation drawn per sentence: {"outputs" (B,), "scores" (B,) its
        log-probability under the model}; the same sentence, options and seed give the
        same output whatever else is in the batch; top_k 1 is greedy search."""
        checks = opt.assert_sampling(inputs, temperature, top_k, top_p, seed)
        temperature, top_k, top_p, seed = opt.checked(checks, temperature, top_k, top_p, seed)
        source, lengths, empty, truncated = self._encode_inputs(inputs)
        memory = self.model.encode(source)
        cache = self.model.init_cache(memory, source)
        bos = tf.fill([tf.shape(source)[0]], BOS_ID)
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        ids, scores = search.sample(
            self.model.decode_step, bos, cache,
            self._max_lengths(lengths, self.max_extra_length), EOS_ID, sampling,
            min_length=self._search_min_length,
        )  # fmt: skip
        outputs = self._detokenize(ids[:, tf.newaxis], empty)[:, 0]
        return {"outputs": outputs, "scores": tf.where(empty, 0.0, scores), "truncated": truncated}
