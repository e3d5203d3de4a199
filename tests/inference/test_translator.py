import functools

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import config
from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.inference.translator import DecodingOptionsError, Translator
from keras_transformer.run_dir import load_trained
from tests.inference import reference
from tests.run_fixture import make_run

SENTENCES = [
    "A man is riding a bike.",
    "Two dogs play in the snow near a red house.",
    "A girl.",
    "People walk.",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, multi30k_dir):
    """The same weights whatever ran before in this worker: the tests below that count
    decoded rows or read one-token outputs depend on the model."""
    path = make_run(str(tmp_path_factory.mktemp("run")), multi30k_dir, seed=0)
    model, tokenizer, _ = load_trained(path)
    return model, tokenizer


@pytest.fixture(scope="module")
def translator(trained):
    return Translator(*trained, beam_size=4, alpha=0.6, max_extra_length=10)


def test_defaults_are_the_papers():
    assert (config.BEAM_SIZE, config.ALPHA, config.MAX_EXTRA_LENGTH) == (4, 0.6, 50)
    defaults = Translator.__init__.__kwdefaults__
    assert (defaults["beam_size"], defaults["alpha"], defaults["max_extra_length"]) == (4, 0.6, 50)
    # the peers' default, not the paper's (which sets none)
    assert config.MIN_LENGTH == defaults["min_length"] == 1


def test_batch_translates_as_sentences_one_by_one(translator):
    batch = translator(tf.constant(SENTENCES))
    for i, sentence in enumerate(SENTENCES):
        single = translator(tf.constant([sentence]))
        assert single["outputs"].numpy()[0] == batch["outputs"].numpy()[i]
        np.testing.assert_allclose(
            single["scores"].numpy()[0], batch["scores"].numpy()[i], atol=1e-4
        )


def test_nbest_is_sorted_and_first_equals_best(translator):
    best = translator(tf.constant(SENTENCES))
    nbest = translator.translate_nbest(tf.constant(SENTENCES))
    assert nbest["outputs"].shape == (4, 4)
    scores = nbest["scores"].numpy()
    assert np.all(np.diff(scores, axis=1) <= 1e-6)
    np.testing.assert_array_equal(nbest["outputs"].numpy()[:, 0], best["outputs"].numpy())


def test_edge_inputs(translator):
    inputs = tf.constant(["", "   ", b"caf\xc3 \xff broken", " ".join(["word"] * 400)])
    out = translator(inputs)
    assert out["outputs"].numpy()[0] == b"" and out["outputs"].numpy()[1] == b""
    assert np.all(out["scores"].numpy()[:2] == 0.0)
    assert np.all(np.isfinite(out["scores"].numpy()))
    empty = translator(tf.constant([], tf.string))
    assert empty["outputs"].shape == (0,)


class NeverEnds:
    """The model with eos made (almost) impossible: every hypothesis runs to its length bound,
    where the search must force eos."""

    def __init__(self, model):
        self.model, self.config = model, model.config

    def encode(self, source):
        return self.model.encode(source)

    def init_cache(self, memory, source):
        return self.model.init_cache(memory, source)

    def decode_step(self, ids, step, cache):
        logits, cache = self.model.decode_step(ids, step, cache)
        return logits - 1e4 * tf.one_hot(EOS_ID, tf.shape(logits)[-1]), cache


class EosFirst(NeverEnds):
    """The model with eos made (almost) certain at every step."""

    def decode_step(self, ids, step, cache):
        logits, cache = self.model.decode_step(ids, step, cache)
        return logits + 1e4 * tf.one_hot(EOS_ID, tf.shape(logits)[-1]), cache


@pytest.mark.parametrize("min_length", [None, 0, 1, 3])
def test_min_length_tokens_come_before_eos(trained, min_length):
    """A model that always wants eos: by default (1) every non-empty source gets one token
    then eos, never ""; min_length 0 gives "" (eos right away, the paper's search), 3 three
    tokens; the same through translate_with_options with a prefix of one token."""
    model, tokenizer = trained
    kwargs = {} if min_length is None else {"min_length": min_length}
    translator = Translator(EosFirst(model), tokenizer, **kwargs)
    expected = config.MIN_LENGTH if min_length is None else min_length
    ids, *_ = translator.search(tf.constant(SENTENCES), 2)
    first_eos = np.argmax(ids.numpy() == EOS_ID, axis=-1)  # (B, K)
    assert np.all(first_eos[:, 0] == expected) and np.all(first_eos >= expected)
    outputs = translator(tf.constant(SENTENCES))["outputs"].numpy()
    assert [bool(text) for text in outputs] == [expected > 0] * len(SENTENCES)
    ids, *_ = translator.search(tf.constant(SENTENCES), 2, prefix=tf.fill([4], "Ein"))
    prefix_length = int(tf.size(tokenizer.tokenize(tf.constant(["Ein"]))[0]))
    first_eos = [np.flatnonzero(h == EOS_ID)[0] for h in ids[:, 0].numpy()]
    assert first_eos == [max(expected, prefix_length)] * len(SENTENCES)
    n = len(SENTENCES)  # sampling keeps the minimum too
    sampled = translator.sample(
        tf.constant(SENTENCES), tf.ones([n]), tf.zeros([n], tf.int32), tf.ones([n]),
        tf.range(n, dtype=tf.int64),
    )["outputs"].numpy()  # fmt: skip
    assert [bool(text) for text in sampled] == [expected > 0] * n


def test_min_length_must_be_a_count(trained):
    for bad in (-1, 1.5, True):
        with pytest.raises(DecodingOptionsError, match="^min_length must") as info:
            Translator(*trained, min_length=bad)
        assert info.value.option == "min_length"


class CountsRows(NeverEnds):
    """The model, counting the rows (beams) of all its decoding steps (a variable, so also
    inside a tf.function): a sentence that leaves the batch earlier costs fewer."""

    def __init__(self, model):
        super().__init__(model)
        self.rows = tf.Variable(0)

    def decode_step(self, ids, step, cache):
        with tf.control_dependencies([self.rows.assign_add(tf.shape(ids)[0])]):
            return self.model.decode_step(ids, step, cache)


def test_the_search_stops_once_the_hypotheses_kept_are_settled(trained):
    """serving_default keeps 1 hypothesis, translate_nbest K, translate_with_options
    num_hypotheses: fewer kept, fewer rows decoded (the first n are the same: the test
    above)."""
    model, tokenizer = trained
    counted = CountsRows(model)
    translator = Translator(counted, tokenizer, beam_size=4, alpha=0.6, max_extra_length=10)
    sentences = tf.constant(SENTENCES)

    def rows(run):
        counted.rows.assign(0)
        run()
        return int(counted.rows.numpy())

    kept = {
        n: rows(lambda n=n: translator.translate_with_options(sentences, *vectors(4, 0.6, 10, n)))
        for n in (1, 4)
    }
    assert rows(lambda: translator(sentences)) == kept[1] < kept[4]
    assert rows(lambda: translator.translate_nbest(sentences)) == kept[4]


@pytest.mark.parametrize("extra", [1, 3])
def test_eos_lands_at_input_length_plus_extra(trained, extra):
    model, tokenizer = trained
    translator = Translator(NeverEnds(model), tokenizer, max_extra_length=extra)
    ids, *_ = translator.search(tf.constant(SENTENCES), 3)
    for i, sentence in enumerate(SENTENCES):
        source_len = int(tf.size(tokenizer.tokenize(tf.constant([sentence]))[0])) + 1  # + eos
        for hypothesis in ids[i].numpy():
            eos = np.flatnonzero(hypothesis == EOS_ID)
            assert eos.tolist() == [source_len + extra - 1]  # one eos, at the bound
            assert not hypothesis[eos[0] + 1 :].any()


def vectors(beam_size, alpha, max_extra_length, num_hypotheses, prefix=""):
    """translate_with_options' per-sentence inputs, the same for every sentence."""
    n = len(SENTENCES)
    return (
        tf.fill([n], beam_size),
        tf.fill([n], float(alpha)),
        tf.fill([n], max_extra_length),
        tf.fill([n], num_hypotheses),
        tf.fill([n], prefix),
    )


def test_beam_one_is_greedy_search(trained, translator):
    model, tokenizer = trained
    source, _, empty, _ = translator._encode_inputs(tf.constant(SENTENCES))
    lengths = tf.reduce_sum(tf.cast(source > 0, tf.int32), 1) + 7
    greedy, _ = reference.model_greedy(
        model, source, lengths.numpy(), BOS_ID, EOS_ID, min_length=config.MIN_LENGTH + 1
    )
    expected = translator._detokenize(tf.constant(greedy)[:, tf.newaxis], empty)[:, 0]
    out = translator.translate_with_options(tf.constant(SENTENCES), *vectors(1, 0.0, 7, 1))
    np.testing.assert_array_equal(out["outputs"].numpy()[:, 0], expected.numpy())


def test_options_match_a_translator_built_with_them(trained, translator):
    model, tokenizer = trained
    built = Translator(model, tokenizer, beam_size=3, alpha=1.0, max_extra_length=5)
    expected = built.translate_nbest(tf.constant(SENTENCES))
    got = translator.translate_with_options(tf.constant(SENTENCES), *vectors(3, 1.0, 5, 2))
    assert got["outputs"].shape == (4, 2)
    np.testing.assert_array_equal(got["outputs"], expected["outputs"][:, :2])
    np.testing.assert_allclose(got["scores"], expected["scores"][:, :2], atol=1e-5)


def test_a_sentence_keeping_n_hypotheses_gets_the_n_best_of_the_full_list(translator):
    """num_hypotheses per sentence (the search stops once each sentence's n are settled):
    sentence i's first n columns are translate_nbest's (which waits for all K), "" and -inf
    after them; with a prefix too."""
    sentences = tf.constant(SENTENCES)
    n = np.array([1, 2, 3, 4], np.int32)
    beam, alpha, extra, _, _ = vectors(4, 0.6, 10, 1)
    for prefix in ("", "Ein"):
        full = translator.translate_with_options(sentences, *vectors(4, 0.6, 10, 4, prefix))
        got = translator.translate_with_options(
            sentences, beam, alpha, extra, tf.constant(n), tf.fill([4], prefix)
        )
        for i, k in enumerate(n):
            np.testing.assert_array_equal(got["outputs"][i, :k], full["outputs"][i, :k])
            np.testing.assert_allclose(got["scores"][i, :k], full["scores"][i, :k], atol=1e-5)
            assert np.all(got["outputs"][i, k:] == b"")
            assert np.all(got["scores"][i, k:] == -np.inf)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(beam_size=0), "beam_size"),
        (dict(beam_size=65), "beam_size"),
        (dict(alpha=-0.1), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(max_extra_length=0), "max_extra_length"),
        (dict(attention_layer=2), "attention_layer"),  # the tiny preset has 2 layers
    ],
)
def test_bad_constructor_options_name_the_option(trained, kwargs, name):
    with pytest.raises(DecodingOptionsError, match=f"^{name} must") as info:
        Translator(*trained, **kwargs)
    assert info.value.option == name


def test_beams_reordered_by_their_slots_equal_caches_copied_and_gathered(trained, translator):
    """The self-attention cache of B sentence rows, shared by K beams each and never
    reordered (each beam reads its own history through the slots), gives the logits of a
    per-beam cache (the sentence cache copied K times) that is reordered by a gather after
    every step, as beam search would, with random parents within each sentence."""
    model, _ = trained
    source, *_ = translator._encode_inputs(tf.constant(SENTENCES))
    cache = model.init_cache(model.encode(source), source)
    k, batch = 3, len(SENTENCES)
    rng = np.random.default_rng(0)
    copied = {
        **cache,
        "rows": tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), cache["rows"]),
        "sentence": tf.nest.map_structure(lambda t: tf.repeat(t, k, axis=0), cache["sentence"]),
    }
    shared = {**cache, "rows": copied["rows"]}
    steps = 12  # past a move of the recent cache block into the main one (RECENT_STEPS 8)
    ids = tf.constant(rng.integers(4, 50, size=(steps, batch * k)), tf.int32)
    for step in range(steps):
        expected, copied = model.decode_step(ids[step], step, copied)
        got, shared = model.decode_step(ids[step], step, shared)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        assert shared["sentence"]["self"]["layer_0"]["k"].shape[0] == batch  # never copied
        parents = (np.arange(batch)[:, None] * k + rng.integers(0, k, size=(batch, k))).ravel()
        reorder = functools.partial(tf.nest.map_structure, lambda t, p=parents: tf.gather(t, p))
        copied = {
            **copied,
            "rows": reorder(copied["rows"]),
            "sentence": reorder(copied["sentence"]),
        }
        shared = {**shared, "rows": reorder(shared["rows"])}


def test_every_signature_says_which_inputs_were_cut(trained, translator):
    """max_input_length 6 (eos included): the inputs of more than 5 pieces are cut, and
    every signature's "truncated" says which; score's "target_truncated" says which targets
    did not fit the positions (learned positions only: none here)."""
    model, tokenizer = trained
    cutting = Translator(model, tokenizer, max_input_length=6, max_extra_length=3)
    inputs = tf.constant(SENTENCES)
    pieces = tokenizer.tokenize(inputs).row_lengths().numpy()
    expected = pieces > 5
    assert expected.any() and not expected.all()
    n = len(SENTENCES)
    outputs = {
        "serving_default": cutting(inputs),
        "translate_nbest": cutting.translate_nbest(inputs),
        "translate_with_options": cutting.translate_with_options(inputs, *vectors(2, 0.6, 3, 1)),
        "score": cutting.score(inputs, inputs),
        "sample": cutting.sample(
            inputs, tf.fill([n], 1.0), tf.fill([n], 0), tf.fill([n], 1.0),
            tf.zeros([n], tf.int64),
        ),
    }  # fmt: skip
    for name, out in outputs.items():
        np.testing.assert_array_equal(out["truncated"], expected, err_msg=name)
    assert not outputs["score"]["target_truncated"].numpy().any()
    # the model's own limit (the fixture's translator has no other) cuts none of these
    assert translator.max_input_length == model.config.max_length
    assert not translator(inputs)["truncated"].numpy().any()


def test_stop_rule_per_sentence_matches_a_translator_built_with_it(trained, translator):
    """translate_with_stop_rule's stop_rule ("" = the constructor's) gives each sentence what
    a translator built with that rule gives it through translate_with_options (which keeps
    0.1.0's inputs, so uses the constructor's rule); an unknown name is an InvalidArgument
    error naming the signature."""
    model, tokenizer = trained
    inputs = tf.constant(SENTENCES)
    rules = ["", "finished", "top", "exact"]
    beam, alpha, extra, num, prefix = vectors(3, 0.6, 10, 2)
    got = translator.translate_with_stop_rule(
        inputs, beam, alpha, extra, num, prefix, tf.constant(rules)
    )
    expected_by_rule = {}  # "" and "exact" build the same translator: built and run once
    for i, rule in enumerate(rules):
        rule = rule or "exact"
        if rule not in expected_by_rule:
            built = Translator(model, tokenizer, beam_size=3, max_extra_length=10, stop_rule=rule)
            expected_by_rule[rule] = built.translate_with_options(inputs, *vectors(3, 0.6, 10, 2))
        expected = expected_by_rule[rule]
        np.testing.assert_array_equal(got["outputs"][i], expected["outputs"][i])
        np.testing.assert_allclose(got["scores"][i], expected["scores"][i], atol=1e-5)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match="translate_with_stop_rule: input stop_rule must be one of",
    ):
        translator.translate_with_stop_rule(
            inputs, beam, alpha, extra, num, prefix, tf.fill([len(SENTENCES)], "fast")
        )
    with pytest.raises(DecodingOptionsError, match="^stop_rule must be one of"):
        Translator(model, tokenizer, stop_rule="fast")
