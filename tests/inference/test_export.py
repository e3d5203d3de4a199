import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer import config
from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.inference.agreement import REPORT_FILE
from keras_transformer.inference.export import (
    AVERAGE_LAST,
    ExportError,
    export_run,
    export_translator,
)
from keras_transformer.inference.serving_layout import (
    WARMUP_FILE,
    WARMUP_OPTIONS,
    models_config,
    warmup_record,
)
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import Run, load_trained
from tests.inference import reference
from tests.run_fixture import make_run

SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl."]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh interpreter that imports only tensorflow and tensorflow_text, loading the
# SavedModel through a TF1 session and its SignatureDefs, as TF Serving does. argv[2] is a
# JSON list of requests: {"signature": name, "inputs": [str], "options": {name: [value]}};
# strings travel as latin-1 code points (so any bytes can be sent), outputs come back whole.
TF1_CLIENT = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
assert not any(m.startswith("keras_transformer") for m in sys.modules)
tf.compat.v1.disable_eager_execution()
requests = json.loads(sys.argv[2])
results = []

def value(info, data):
    dtype = tf.dtypes.as_dtype(info.dtype)
    if dtype == tf.string:
        return np.array([s.encode("latin-1") for s in data], dtype=object)
    return np.array(data, dtype=dtype.as_numpy_dtype)

def plain(array):
    if array.dtype == object:
        return tf.nest.map_structure(lambda o: o.decode("utf-8"), array.tolist())
    return array.tolist()

with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], sys.argv[1])
    signatures = {
        name: {"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs)}
        for name, sig in meta.signature_def.items()
    }
    for request in requests:
        sig = meta.signature_def[request.get("signature", "serving_default")]
        fetch = {k: v.name for k, v in sig.outputs.items()}
        given = {"inputs": request["inputs"], **request.get("options", {})}
        feed = {sig.inputs[k].name: value(sig.inputs[k], v) for k, v in given.items()}
        try:
            results.append({k: plain(v) for k, v in sess.run(fetch, feed).items()})
        except tf.errors.InvalidArgumentError as err:
            results.append({"error": err.message[:400]})
print(json.dumps({"signatures": signatures, "results": results}))
"""


def tf1_session(path, requests):
    out = subprocess.run(
        [sys.executable, "-c", TF1_CLIENT, path, json.dumps(requests)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# saved_model_cli as its console script runs it, with tensorflow_text's ops registered.
SAVED_MODEL_CLI = (
    "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
    "sys.argv = ['saved_model_cli'] + sys.argv[1:]; saved_model_cli.main()"
)
# Runs clients (scripts as `python -c` runs them: TF1_CLIENT, TF_SERVING, SAVED_MODEL_CLI)
# in turn in one fresh interpreter, each with its own argv and stdout: one import of
# tensorflow and tensorflow_text for all. argv[1]: JSON list of [script, argv]; prints the
# JSON list of {"stdout", "error": the traceback of its failure or null} per client.
CLIENTS = r"""
import contextlib, io, json, sys, traceback
answers = []
for code, argv in json.loads(sys.argv[1]):
    sys.argv = ["-c", *argv]
    out, error = io.StringIO(), None
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<client>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            error = None if stop.code in (None, 0) else f"exit status {stop.code}"
        except BaseException:  # noqa: BLE001 - the client's failure, reported as its answer
            error = traceback.format_exc()
    answers.append({"stdout": out.getvalue(), "error": error})
print(json.dumps(answers))
"""


def clients(*runs):
    """Each client (script, argv) of `runs` run in turn by CLIENTS in one fresh interpreter:
    their {"stdout", "error"}."""
    out = subprocess.run(
        [sys.executable, "-c", CLIENTS, json.dumps(runs)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def answer_of(client):
    """A client's answer: the JSON of its stdout's last line, once it ran through."""
    assert client["error"] is None, client["error"][-3000:]
    return json.loads(client["stdout"].strip().splitlines()[-1])


@pytest.fixture(scope="module")
def exported(tmp_path_factory, multi30k_dir):
    base = tmp_path_factory.mktemp("serving")
    mask = os.umask(0o022)  # the common default; test_files_have_the_umasks_modes reads it
    try:
        run = make_run(str(base / "run"), multi30k_dir)
        path = export_run(run, str(base / "exports"), model_name="transformer", max_extra_length=10)
    finally:
        os.umask(mask)
    return run, str(base / "exports"), path


@pytest.fixture(scope="module")
def trained(exported):
    """(model, tokenizer, translator): the exported run's weights loaded once, and
    `translator(**settings)`, the Translator of those settings built once (a Translator traces
    its search on first use; the tests below compare the export with the same ones)."""
    model, tokenizer, _ = load_trained(exported[0], average_last=AVERAGE_LAST)
    built = {}

    def translator(**settings):
        key = tuple(sorted(settings.items()))
        if key not in built:
            built[key] = Translator(model, tokenizer, **settings)
        return built[key]

    return model, tokenizer, translator


SAVED_MODEL_CLI_ARGS = ["run", "--tag_set", "serve", "--signature_def", "translate_nbest",
                        "--input_exprs", 'inputs=["A girl.", ""]']  # fmt: skip


@pytest.fixture(scope="module")
def fresh_process(exported, trained):
    """The serving clients of the tests below, run by one fresh interpreter that imports only
    tensorflow and tensorflow_text (`clients`: one import, not one per client):
    {"saved_model_cli": its run of translate_nbest, "session": the TF1 session's answer to
    the REQUESTS groups, "groups": those groups, "serving": the emulated TF Serving's
    answers to documented_jobs then refused_jobs, "documented": how many are the former}."""
    path = exported[2]
    groups = {name: make(path, trained) for name, make in REQUESTS.items()}
    requests = [r for group in groups.values() for r in group]
    documented = documented_jobs(documented_requests())
    cli, session, serving = clients(
        (SAVED_MODEL_CLI, [*SAVED_MODEL_CLI_ARGS, "--dir", path]),
        (TF1_CLIENT, [path, json.dumps(requests)]),
        (TF_SERVING, [path, json.dumps(documented + refused_jobs())]),
    )
    return {"saved_model_cli": cli, "session": session, "groups": groups,
            "serving": serving, "documented": len(documented)}  # fmt: skip


@pytest.fixture(scope="module")
def session(fresh_process):
    """The TF1 session's answers to the requests of every test below, from one fresh process
    (one load of the SavedModel, not one per test): {"signatures": ..., group: [results]},
    a group's results in the order of its requests (REQUESTS)."""
    answer = answer_of(fresh_process["session"])
    found, start = {"signatures": answer["signatures"]}, 0
    for name, requests in fresh_process["groups"].items():
        found[name] = answer["results"][start : start + len(requests)]
        start += len(requests)
    assert start == len(answer["results"])
    return found


def modes(root):
    """{path relative to root: permission bits} of every directory and file under root."""
    found = {}
    for folder, names, files in os.walk(root):
        for name in names + files:
            path = os.path.join(folder, name)
            found[os.path.relpath(path, root)] = os.stat(path).st_mode & 0o777
    return found


def test_files_have_the_umasks_modes(exported):
    """Under umask 022 everything the run and the export wrote reads as `open` and
    `os.makedirs` give it: directories 0755, files 0644 (TF Serving running as another user
    reads the model), not mkdtemp's 0700 and mkstemp's 0600."""
    run, export_dir, path = exported
    for root in (run, export_dir):
        found = modes(root)
        assert found, root
        for relative, mode in found.items():
            full = os.path.join(root, relative)
            assert mode == (0o755 if os.path.isdir(full) else 0o644), (full, oct(mode))
    found = modes(export_dir)
    assert {"models.config", "transformer", "transformer/1", "transformer/1/saved_model.pb"} <= set(
        found
    )
    assert {"config.json", "spm.model", "checkpoints/checkpoint"} <= set(modes(run))


def test_layout(exported):
    run, export_dir, path = exported
    assert path == os.path.join(export_dir, "transformer", "1")
    for name in (
        "saved_model.pb",
        "variables",
        "assets/spm.model",
        "assets.extra/tf_serving_warmup_requests",
    ):
        assert os.path.exists(os.path.join(path, name)), name
    with open(os.path.join(export_dir, "models.config")) as handle:
        config = handle.read()
    assert config == models_config("transformer", "/models/transformer")
    # without agreement sentences (export_run's default), the report says why
    with open(os.path.join(path, "assets.extra", REPORT_FILE)) as handle:
        assert json.load(handle) == {"sentences": 0, "skipped": "--agreement-sentences 0"}


OTHER_MODELS = """model_config_list {
  config {
    name: "de_en"
    base_path: "/models/de_en {\\"odd\\"}"
    model_platform: "tensorflow"
    model_version_policy { specific { versions: 2 } }
  }
  config {
    name: "transformer"
    base_path: "/old/path"
    model_platform: "tensorflow"
  }
  config { name: "fr_en" base_path: "/models/fr_en" model_platform: "tensorflow" }
}
"""


def test_models_config_keeps_the_other_models():
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    def parse(text):
        return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())

    merged = models_config("transformer", "/models/transformer", OTHER_MODELS)
    entries = parse(merged).model_config_list.config
    assert [c.name for c in entries] == ["de_en", "transformer", "fr_en"]
    assert entries[1].base_path == "/models/transformer"
    old = parse(OTHER_MODELS).model_config_list.config
    assert entries[0] == old[0] and entries[2] == old[2]  # kept field for field
    added = parse(models_config("new", "/models/new", merged)).model_config_list.config
    assert [c.name for c in added] == ["de_en", "transformer", "fr_en", "new"]
    with pytest.raises(ExportError, match="models.config"):
        models_config("x", "/x", "not a config {", "exports/models.config")


def test_models_config_reads_comments_and_single_quotes():
    """A `# ... }` comment and a name in single quotes are text-format protobuf: every model
    after the comment is kept, and the quoted entry is replaced, not doubled."""
    existing = """model_config_list {
  # the German model }
  config { name: 'transformer' base_path: "/old" model_platform: "tensorflow" }
  config { name: "after_comment" base_path: "/models/after" model_platform: "tensorflow" }
}
"""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    merged = models_config("transformer", "/models/transformer", existing)
    config = text_format.Parse(merged, model_server_config_pb2.ModelServerConfig())
    entries = config.model_config_list.config
    assert [(c.name, c.base_path) for c in entries] == [
        ("transformer", "/models/transformer"),
        ("after_comment", "/models/after"),
    ]


def test_two_concurrent_exports_keep_their_own_files(exported, tmp_path):
    """Each export stages in a private directory: two at once, of the same version number
    even, never delete each other's files; one wins, the other says the version exists."""
    import threading

    # a one-layer model of the run's tokenizer: the staging is the same, the tracing shorter
    tokenizer = Run(exported[0]).load_tokenizer()
    cfg = kt.TransformerConfig.preset(
        "tiny", num_layers=1, vocab_size=tokenizer.vocab_size, max_length=64
    )
    model = kt.Transformer(cfg)
    model.build()
    translator = Translator(model, tokenizer, max_extra_length=3)
    results = []

    def export():
        try:
            results.append(export_translator(translator, str(tmp_path), version=1))
        except ExportError as err:
            results.append(err)

    other = tmp_path / "transformer" / ".tmp-1"  # where another export (old naming) stages
    other.mkdir(parents=True)
    (other / "saved_model.pb").write_bytes(b"another export's file")
    threads = [threading.Thread(target=export) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    paths = [r for r in results if isinstance(r, str)]
    assert len(paths) >= 1 and all(isinstance(r, (str, ExportError)) for r in results)
    assert (other / "saved_model.pb").read_bytes() == b"another export's file"
    assert sorted(os.listdir(tmp_path / "transformer")) == [".tmp-1", "1"]  # ours cleaned up
    loaded = tf.saved_model.load(paths[0])
    assert (
        loaded.signatures["serving_default"](inputs=tf.constant(["A dog."]))["outputs"].shape == 1
    )


def test_no_overwrite(exported):
    """An existing version is refused (before anything is written); the next version by
    default: test_export_cli_merges_models_config_and_says_what_it_wrote."""
    run, export_dir, _ = exported
    with pytest.raises(ExportError, match="already exists"):
        export_run(run, export_dir, version=1)


WEIRD = ["", "   ", "caf\xc3 \xff broken", " ".join(["word"] * 700)]  # latin-1 -> raw bytes


def fresh_process_requests(path, trained=None):
    return [{"inputs": SENTENCES}, {"inputs": WEIRD}, {"inputs": []}]


def test_tf1_session_in_a_fresh_process_matches_the_translator(trained, session):
    result = {"signatures": session["signatures"], "results": session["fresh_process"]}
    assert result["signatures"]["serving_default"] == {
        "inputs": ["inputs"],
        "outputs": ["outputs", "scores", "truncated"],
    }
    assert result["signatures"]["translate_nbest"]["outputs"] == ["outputs", "scores", "truncated"]
    assert result["signatures"]["translate_with_options"] == {
        "inputs": [
            "alpha", "beam_size", "inputs", "max_extra_length", "num_hypotheses",
            "target_prefix",
        ],
        "outputs": ["outputs", "scores", "truncated"],
    }  # fmt: skip
    assert result["signatures"]["translate_with_stop_rule"] == {
        "inputs": [
            "alpha", "beam_size", "inputs", "max_extra_length", "num_hypotheses", "stop_rule",
            "target_prefix",
        ],
        "outputs": ["outputs", "scores", "truncated"],
    }  # fmt: skip
    assert result["signatures"]["score"] == {
        "inputs": ["inputs", "targets"],
        "outputs": [
            "attention", "scores", "source_tokens", "target_tokens", "target_truncated",
            "token_scores", "truncated",
        ],
    }  # fmt: skip
    assert result["signatures"]["sample"] == {
        "inputs": ["inputs", "seed", "temperature", "top_k", "top_p"],
        "outputs": ["outputs", "scores", "truncated"],
    }
    expected = trained[2](max_extra_length=10)(tf.constant(SENTENCES))
    assert result["results"][0]["outputs"] == [s.decode() for s in expected["outputs"].numpy()]
    assert result["results"][0]["scores"] == pytest.approx(
        expected["scores"].numpy().tolist(), abs=1e-4
    )
    assert result["results"][0]["truncated"] == [False] * len(SENTENCES)
    weird_out = result["results"][1]
    assert weird_out["outputs"][:2] == ["", ""] and len(weird_out["outputs"]) == 4
    # 700 words do not fit the model's 64 positions: the output says so
    assert weird_out["truncated"] == [False, False, False, True]
    assert result["results"][2] == {"outputs": [], "scores": [], "truncated": []}


def options(
    n, beam_size=4, alpha=0.6, max_extra_length=10, num_hypotheses=1, prefix="", stop_rule=None
):
    """translate_with_options' per-sentence inputs for n sentences, each a list (a value
    given as a list is taken as it is); with a `stop_rule`, translate_with_stop_rule's."""
    given = {
        "beam_size": beam_size,
        "alpha": alpha,
        "max_extra_length": max_extra_length,
        "num_hypotheses": num_hypotheses,
        "target_prefix": prefix,
    }
    if stop_rule is not None:
        given["stop_rule"] = stop_rule
    return {k: v if isinstance(v, list) else [v] * n for k, v in given.items()}


OPTIONS_SOURCE = SENTENCES + ["A little girl climbs into a wooden playhouse.", "A dog runs."]


def with_options_requests(path, trained=None):
    source = OPTIONS_SOURCE
    with_options = lambda **kw: {  # noqa: E731
        "signature": "translate_with_options",
        "inputs": source,
        "options": options(len(source), **kw),
    }
    return [
        {"inputs": source},  # serving_default, exported with beam 4, alpha 0.6, +10
        with_options(),
        with_options(beam_size=1, alpha=0.0, max_extra_length=6),
        with_options(beam_size=6, alpha=0.0, num_hypotheses=6),
        with_options(beam_size=6, alpha=1.5, num_hypotheses=6),
        with_options(beam_size=5, num_hypotheses=3),
    ]


def test_translate_with_options_through_a_tf1_session(trained, session):
    """Each option does what it says, per request, in a process without keras_transformer."""
    source = OPTIONS_SOURCE
    default, same, greedy, short_pref, long_pref, three = session["with_options"]
    # the export's own settings through the options signature: serving_default's result
    assert [row[0] for row in same["outputs"]] == default["outputs"]
    assert [row[0] for row in same["scores"]] == pytest.approx(default["scores"], abs=1e-5)

    model, _, translator_with = trained
    translator = translator_with(beam_size=1, alpha=0.0, max_extra_length=6)
    source_ids, _, empty, _ = translator._encode_inputs(tf.constant(source))
    lengths = tf.reduce_sum(tf.cast(source_ids > 0, tf.int32), 1) + 6
    ids, _ = reference.model_greedy(
        model, source_ids, lengths.numpy(), BOS_ID, EOS_ID, min_length=config.MIN_LENGTH + 1
    )
    expected = translator._detokenize(tf.constant(ids)[:, tf.newaxis], empty)[:, 0].numpy()
    assert [row[0] for row in greedy["outputs"]] == [t.decode() for t in expected]  # beam 1

    # num_hypotheses shapes the output; the n best are sorted
    assert [len(row) for row in three["outputs"]] == [3] * len(source)
    assert all(np.all(np.diff(row) <= 1e-6) for row in three["scores"])

    # alpha, per request: the n-best lists are those of translators built with that alpha
    for result, alpha in ((short_pref, 0.0), (long_pref, 1.5)):
        built = translator_with(beam_size=6, alpha=alpha, max_extra_length=10)
        expected = built.translate_nbest(tf.constant(source))
        texts = expected["outputs"].numpy()
        assert result["outputs"] == [[t.decode() for t in row] for row in texts]
        np.testing.assert_allclose(result["scores"], expected["scores"], atol=1e-4)
    # and alpha is the length-penalty exponent: the same hypothesis scores log p under 0 and
    # log p / ((5 + n) / 6) ** 1.5 under 1.5, n being its length (an integer, eos included)
    shared = 0
    for texts0, scores0, texts15, scores15 in zip(
        short_pref["outputs"], short_pref["scores"], long_pref["outputs"], long_pref["scores"]
    ):
        for text, score0 in zip(texts0, scores0):
            if texts0.count(text) == texts15.count(text) == 1 and score0 < -1e-3:
                n = 6 * (score0 / scores15[texts15.index(text)]) ** (1 / 1.5) - 5
                assert n == pytest.approx(round(n), abs=1e-2) and round(n) >= 1
                shared += 1
    assert shared >= len(source)


BAD_OPTIONS = [
    (dict(beam_size=0), "beam_size"),
    (dict(alpha=-1.0), "alpha"),
    (dict(beam_size=2, num_hypotheses=3), "num_hypotheses"),
    (dict(max_extra_length=0), "max_extra_length"),
    (dict(beam_size=[4, 0, 4]), "beam_size"),  # one sentence's value
    (dict(alpha=[0.6]), "alpha"),  # not one value per sentence
    (dict(stop_rule="fast"), "stop_rule"),
]
BAD_SAMPLING = [
    ({"temperature": [0.0]}, "temperature"),
    ({"top_k": [-1]}, "top_k"),
    ({"top_p": [1.5]}, "top_p"),
    ({"seed": [1, 2]}, "seed"),
]


def bad_options_request(bad):
    signature = "translate_with_stop_rule" if "stop_rule" in bad else "translate_with_options"
    return {"signature": signature, "inputs": SENTENCES, "options": options(len(SENTENCES), **bad)}


def bad_sampling_request(options_):
    given = {"temperature": [1.0], "top_k": [0], "top_p": [1.0], "seed": [0], **options_}
    return {"signature": "sample", "inputs": ["A dog."], "options": given}


def bad_requests(path, trained=None):
    requests = [bad_options_request(bad) for bad, _ in BAD_OPTIONS]
    return requests + [bad_sampling_request(given) for given, _ in BAD_SAMPLING]


@pytest.fixture(scope="module")
def bad_results(exported, session):
    """The results of every bad request below, from the TF1 session of `session` (one
    process, not one per case; the client reports each request's error on its own)."""
    requests = bad_requests(exported[2])
    return {
        json.dumps(r, sort_keys=True): result
        for r, result in zip(requests, session["bad"], strict=True)
    }


@pytest.mark.parametrize("bad, name", BAD_OPTIONS)
def test_bad_options_are_invalid_argument_errors_naming_the_input(bad_results, bad, name):
    request = bad_options_request(bad)
    result = bad_results[json.dumps(request, sort_keys=True)]
    assert f"{request['signature']}: input {name} must be" in result["error"]


def test_saved_model_cli_run(fresh_process):
    """saved_model_cli run (as its console script runs it) answers translate_nbest."""
    out = fresh_process["saved_model_cli"]
    assert out["error"] is None, out["error"][-3000:]
    assert (
        "Result for output key outputs" in out["stdout"]
        and "Result for output key scores" in out["stdout"]
        and "Result for output key truncated" in out["stdout"]
    )


def test_signature_defs_are_those_of_0_2(exported):
    """The SignatureDefs of a fresh export equal those recorded from the export before
    ExportArgs (tests/inference/export_signatures.json; xla_warmup: --xla's only)."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    _, _, path = exported
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    found = {
        name: json_format.MessageToDict(sig)
        for name, sig in saved.meta_graphs[0].signature_def.items()
    }
    with open(os.path.join(os.path.dirname(__file__), "export_signatures.json")) as handle:
        recorded = json.load(handle)
    recorded.pop("xla_warmup")
    assert found == recorded


def test_warmup_record_is_a_prediction_log(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    _, _, path = exported
    records = list(
        tf.data.TFRecordDataset(os.path.join(path, "assets.extra", "tf_serving_warmup_requests"))
    )
    log = prediction_log_pb2.PredictionLog.FromString(records[0].numpy())
    request = log.predict_log.request
    assert request.model_spec.name == "transformer"
    assert request.model_spec.signature_name == "serving_default"
    assert tf.make_ndarray(request.inputs["inputs"]).shape == (3,)
    assert log.SerializeToString() == warmup_record(
        "transformer", [b.decode() for b in tf.make_ndarray(request.inputs["inputs"])]
    )


def warmup_requests(path, trained=None):
    """The export's warmup records as the client's requests."""
    from tensorflow_serving.apis import prediction_log_pb2

    records = tf.data.TFRecordDataset(os.path.join(path, "assets.extra", WARMUP_FILE))
    requests = []
    for record in records:
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        given = {k: tf.make_ndarray(v).tolist() for k, v in request.inputs.items()}
        given = {
            k: [x.decode("latin-1") for x in v]  # the client's way to send bytes
            if v and isinstance(v[0], bytes) else v
            for k, v in given.items()
        }  # fmt: skip
        inputs = given.pop("inputs")
        requests.append(
            {"signature": request.model_spec.signature_name, "inputs": inputs, "options": given}
        )
    return requests


def test_warmup_records_ask_every_signature_and_run(exported, session):
    """One record per signature TF Serving may be asked, each a PredictRequest with every
    input of its signature, that runs through a TF1 session (as TF Serving replays them)."""
    requests = warmup_requests(exported[2])
    names = [r["signature"] for r in requests]
    served = sorted(name for name in session["signatures"] if not name.startswith("__"))
    assert sorted(names) == served == sorted(WARMUP_OPTIONS)
    for request in requests:
        expected = session["signatures"][request["signature"]]["inputs"]
        assert sorted(["inputs", *request["options"]]) == expected
    assert len(session["warmup"]) == len(requests)
    assert not any("error" in result for result in session["warmup"])


def test_export_cli_names_a_bad_model_dir(flag_errors):
    out = flag_errors[1]["bad-model-dir"]  # export.py --model-dir {tmp}/nope
    assert out.returncode == 2
    assert "config.json not found" in out.stderr and "Traceback" not in out.stderr


def run_module(*args, **kwargs):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, **kwargs
    )


def run_commands(base, jobs):
    """{name: CompletedProcess} of `python *argv` (from ROOT) for each job {name: (argv,
    stdin bytes or None)}, run by one tests/cli_driver.py: TensorFlow is imported once and
    each command runs in a child forked from that process, with its own argv, stdin, stdout,
    stderr and exit status. stdout is the command's bytes; stderr is text."""
    from tests.cli_contract import run_command

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [env.get("PYTHONPATH")])])
    specs = []
    for name, (argv, stdin) in jobs.items():
        if stdin is not None:
            (base / f"{name}.stdin").write_bytes(stdin)
        stdin_file = str(base / f"{name}.stdin") if stdin is not None else None
        specs.append(dict(argv=list(argv), stdin=stdin_file, env=env, cwd=ROOT, watch=[]))
    (base / "jobs.json").write_text(json.dumps(specs))
    driver = run_command(
        ["-m", "tests.cli_driver", str(base / "jobs.json"), str(base / "out.json")]
    )
    assert driver.returncode == 0, driver.stderr.decode("utf-8", "replace")[-3000:]
    results = json.loads((base / "out.json").read_text())
    return {
        name: subprocess.CompletedProcess(
            argv, r["returncode"], r["stdout"].encode("latin-1"), r["stderr"]
        )
        for (name, (argv, _)), r in zip(jobs.items(), results, strict=True)
    }


def text(out):
    """The command's stdout as text, once it exited 0 (as `check=True` would)."""
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.decode("utf-8")


TRANSLATE = ("-m", "keras_transformer.cli.translate", "--model")
EVALUATE = ("-m", "keras_transformer.cli.evaluate", "--model")
SCORE = ("-m", "keras_transformer.cli.score", "--model")
PREFIXES = ["Ein", "", "Zwei", "", "", "Hunde"]
EVALUATE_BAD = [
    (["--ref", "{missing}"], "{missing} not found"),
    (["--beam-size", "0"], "--beam-size: beam_size must be in [1, 64], got 0"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--model", "{tmp}"], "no saved_model.pb in {tmp}: is it an export version?"),
]
SAMPLINGS = (("1", "64"), ("1", "2"), ("9", "64"))  # (seed, batch size)


@pytest.fixture(scope="module")
def commands(exported, tmp_path_factory):
    """The runs of kt-export, kt-translate, kt-evaluate and kt-score of the tests below, on
    the module's export, from one process tree (tests/cli_driver.py: the 10-17 s import of
    TensorFlow once, not once per command), kt-export's bad-flag runs (flag_error_jobs)
    among them: (their folder, {name: CompletedProcess})."""
    import shutil

    run, _, path = exported
    base = tmp_path_factory.mktemp("commands")
    files = {
        "in.txt": "\n".join(SOURCES) + "\n",
        "ref.txt": "\n".join(reversed(SOURCES)) + "\n",  # any fixed references
        "prefix.txt": "\n".join(PREFIXES) + "\n",
        "tgt.txt": "\n".join(SCORE_TARGETS) + "\n",
        "cut.txt": "\n".join([*SENTENCES, " ".join(["word"] * 700)]) + "\n",
    }
    for name, content in files.items():
        (base / name).write_text(content)
    (base / "raw.txt").write_bytes(INVALID_UTF8)
    src, cut = str(base / "in.txt"), str(base / "cut.txt")
    export_dir = base / "exports"  # beside version 1 of another export
    export_dir.mkdir()
    (export_dir / "models.config").write_text(OTHER_MODELS)
    shutil.copytree(path, export_dir / "transformer" / "1")
    jobs = {
        "export": (("export.py", "--model-dir", run, "--export-dir", str(export_dir)), None),
        "translate": ((*TRANSLATE, path, "--input", src, "--batch-size", "2"), None),
        "translate_greedy": (
            (
                *TRANSLATE,
                path,
                "--input",
                src,
                "--beam-size",
                "1",
                "--alpha",
                "0",
                "--max-extra-length",
                "10",
            ),
            None,
        ),  # fmt: skip
        "evaluate": (
            (*EVALUATE, path, "--src", src, "--ref", str(base / "ref.txt"), "--batch-size", "4"),
            None,
        ),
        "score": (
            (*SCORE, path, "--src", src, "--tgt", str(base / "tgt.txt"), "--batch-size", "2"),
            None,
        ),
        "prefixes": (
            (*TRANSLATE, path, "--input", src, "--prefix-file", str(base / "prefix.txt")),
            None,
        ),
        "stdin": ((*TRANSLATE, path), INVALID_UTF8),
        "invalid_utf8_file": ((*TRANSLATE, path, "--input", str(base / "raw.txt")), None),
        "evaluate_cut": ((*EVALUATE, path, "--src", cut, "--ref", cut, "--beam-size", "1"), None),
        "score_cut": ((*SCORE, path, "--src", cut, "--tgt", cut), None),
    }
    for seed, batch in SAMPLINGS:
        jobs[f"sample-{seed}-{batch}"] = (
            (*TRANSLATE, path, "--input", src, "--sample-topk", "5", "--temperature", "1.2",
             "--seed", seed, "--batch-size", batch),
            None,
        )  # fmt: skip
    for i, (flags, _) in enumerate(EVALUATE_BAD):
        folder = base / f"evaluate-bad-{i}"
        folder.mkdir()
        (folder / "in.txt").write_text("A girl.\n")
        fill = {"missing": str(folder / "nope.txt"), "tmp": str(folder)}
        argv = [*EVALUATE, path, "--src", str(folder / "in.txt"), "--ref", str(folder / "in.txt")]
        jobs[f"evaluate-bad-{i}"] = ((*argv, *[f.format(**fill) for f in flags]), None)
    jobs.update(flag_error_jobs(base))
    return base, run_commands(base, jobs)


def test_export_cli_merges_models_config_and_says_what_it_wrote(commands):
    """kt-export beside version 1 of another export: it writes the next version, 2, merges
    models.config and says what it wrote."""
    base, outputs = commands
    export_dir = base / "exports"
    stdout = text(outputs["export"])
    assert sorted(os.listdir(export_dir / "transformer")) == ["1", "2"]
    path = str(export_dir / "transformer" / "2")
    assert f"{path}: " in stdout and "MiB on disk" in stdout
    assert os.path.join(path, "saved_model.pb") in stdout
    assert (
        "signature translate_with_options: (alpha float32[None], beam_size int32[None], "
        "inputs string[None], max_extra_length int32[None], num_hypotheses int32[None], "
        "target_prefix string[None]) -> (outputs string[None, None], "
        "scores float32[None, None], truncated bool[None])"
    ) in stdout
    assert "signature translate_with_stop_rule: (alpha float32[None], " in stdout
    assert "signature serving_default: (inputs string[None]) -> (outputs string[None]" in stdout
    config = (export_dir / "models.config").read_text()
    assert config == models_config("transformer", "/models/transformer", OTHER_MODELS)


def test_export_defaults_are_the_librarys():
    from keras_transformer.cli import export as cli

    args = cli.parse_args(["--model-dir", "r", "--export-dir", "e"])
    assert (args.beam_size, args.alpha, args.max_extra_length) == (
        config.BEAM_SIZE,
        config.ALPHA,
        config.MAX_EXTRA_LENGTH,
    )
    assert args.average_last == AVERAGE_LAST == 5


EXPORT_BAD = [
    (["--beam-size", "0"], "--beam-size: beam_size must be in [1, 64], got 0"),
    (["--alpha", "-1"], "--alpha: alpha must be a finite number >= 0, got -1.0"),
    (["--version", "0"], "--version must be >= 1, got 0"),
]


def flag_error_jobs(base):
    """`commands`' jobs of kt-export on bad flags or a missing run (no export needed), each
    with a folder of its own, {base}/{name}."""
    jobs = {}
    for i, (flags, _) in enumerate(EXPORT_BAD):
        (base / f"bad-{i}").mkdir()
        folder = str(base / f"bad-{i}")
        jobs[f"bad-{i}"] = (
            ("export.py", "--model-dir", folder, "--export-dir", folder, *flags),
            None,
        )
    (base / "bad-model-dir").mkdir()
    folder = base / "bad-model-dir"
    argv = (
        "export.py",
        "--model-dir",
        str(folder / "nope"),
        "--export-dir",
        str(folder / "exports"),
    )
    jobs["bad-model-dir"] = (argv, None)
    return jobs


@pytest.fixture(scope="module")
def flag_errors(commands):
    """kt-export's runs on bad flags or a missing run: among `commands`' runs (one process
    tree, one import of TensorFlow for every command of the file)."""
    return commands


@pytest.mark.parametrize("case", range(len(EXPORT_BAD)), ids=[f[0] for f, _ in EXPORT_BAD])
def test_export_cli_names_a_bad_flag(flag_errors, case):
    _, message = EXPORT_BAD[case]
    out = flag_errors[1][f"bad-{case}"]
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"export.py: error: {message}"


SOURCES = SENTENCES + [
    "A little girl climbs into a wooden playhouse.",
    "Two young guys with shaggy hair look at their hands while hanging out in the yard.",
    "Dogs.",
]


def test_translate_keeps_input_order_and_shows_progress(trained, commands):
    out = commands[1]["translate"]  # --batch-size 2
    expected = trained[2](max_extra_length=10)(tf.constant(SOURCES))
    # batched by length (not input order), written back in input order
    assert text(out).splitlines() == [t.decode() for t in expected["outputs"].numpy()]
    assert f"{len(SOURCES)}/{len(SOURCES)}" in out.stderr  # the progress bar
    assert "warning" not in out.stderr  # no input cut, no note (see the test below)
    # per-request options: beam 1 through translate_with_options
    greedy = text(commands[1]["translate_greedy"])
    one = trained[2](beam_size=1, alpha=0.0, max_extra_length=10)
    expected = one(tf.constant(SOURCES))["outputs"].numpy()
    assert greedy.splitlines() == [t.decode() for t in expected]


def test_evaluate_scores_the_translations_in_order(trained, commands):
    from keras_transformer.inference.evaluation import score

    references = list(reversed(SOURCES))  # any fixed references: the BLEU must be theirs
    assert (commands[0] / "ref.txt").read_text().splitlines() == references
    result = json.loads(text(commands[1]["evaluate"]))  # --batch-size 4
    hyps = trained[2](max_extra_length=10)(tf.constant(SOURCES))["outputs"]
    expected = score([h.decode() for h in hyps.numpy()], references)
    assert result["bleu"] == expected["bleu"] and result["chrf"] == expected["chrf"]
    assert result["sentences"] == len(SOURCES) and result["target_tokens_per_s"] > 0


@pytest.mark.parametrize("case", range(len(EVALUATE_BAD)), ids=[f[0] for f, _ in EVALUATE_BAD])
def test_evaluate_names_the_bad_flag_or_file(commands, case):
    _, message = EVALUATE_BAD[case]
    folder = commands[0] / f"evaluate-bad-{case}"
    fill = {"missing": str(folder / "nope.txt"), "tmp": str(folder)}
    out = commands[1][f"evaluate-bad-{case}"]
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"kt-evaluate: error: {message.format(**fill)}"


def concatenated(first, second):
    """The request TF Serving's batcher makes of two: every input concatenated on axis 0."""
    merged = {"signature": first["signature"], "inputs": first["inputs"] + second["inputs"]}
    merged["options"] = {k: v + second["options"][k] for k, v in first["options"].items()}
    return merged


def split(result, n):
    return [{k: v[:n] for k, v in result.items()}, {k: v[n:] for k, v in result.items()}]


def assert_same(got, expected, text_keys):
    for key, value in expected.items():
        if key in text_keys:
            assert got[key] == value, key
        else:
            np.testing.assert_allclose(np.array(got[key], float), np.array(value, float), atol=1e-4)


def batching_requests(path, trained=None):
    a_src, b_src = SENTENCES[:2], [SOURCES[3], SOURCES[4], "Dogs."]
    translate = [
        {"signature": "translate_with_options", "inputs": a_src, "options": options(
            2, beam_size=[1, 5], alpha=[0.0, 1.0], max_extra_length=[4, 10],
            num_hypotheses=[1, 2], prefix=["", "Ein"])},
        {"signature": "translate_with_options", "inputs": b_src, "options": options(
            3, beam_size=[3, 2, 6], num_hypotheses=[3, 1, 1], prefix=["Zwei", "", ""])},
    ]  # fmt: skip
    score = [
        {"signature": "score", "inputs": a_src, "options": {"targets": ["Ein Mann.", "Zwei"]}},
        {"signature": "score", "inputs": b_src, "options": {"targets": ["x", "", "Hunde."]}},
    ]
    sample = [
        {"signature": "sample", "inputs": a_src, "options": {
            "temperature": [1.0, 0.7], "top_k": [0, 5], "top_p": [0.9, 1.0], "seed": [3, 4]}},
        {"signature": "sample", "inputs": b_src, "options": {
            "temperature": [1.5, 1.0, 1.0], "top_k": [0, 0, 1], "top_p": [1.0, 1.0, 1.0],
            "seed": [7, 3, 1]}},
    ]  # fmt: skip
    requests = [*translate, concatenated(*translate), *score, concatenated(*score)]
    return requests + [*sample, concatenated(*sample)]


def test_every_signature_survives_server_side_batching(session):
    """Two requests concatenated along axis 0 give exactly the two separate results, through
    a TF1 session: translate_with_options (different options and prefixes per sentence,
    different num_hypotheses per request), score (different target lengths) and sample."""
    results = session["batching"]
    assert not any("error" in r for r in results)
    for i, texts in ((0, ("outputs",)), (3, ("target_tokens", "source_tokens")), (6, ("outputs",))):
        first, second, merged = results[i : i + 3]
        got_first, got_second = split(merged, 2)
        if i == 0:  # N is the largest num_hypotheses of the (merged) request
            assert np.array(merged["outputs"]).shape == (5, 3)
            assert got_first["outputs"][1][2] == "" and got_first["scores"][1][2] == -np.inf
            got_first = {
                k: [row[:2] for row in v] if k != "truncated" else v for k, v in got_first.items()
            }
        if i == 3:  # padding to the merged request's longest sentence
            flat = ("scores", "truncated", "target_truncated")  # (B,): nothing to cut
            got_first = {k: [row[: len(first[k][0])] for row in v] if k not in flat else v
                         for k, v in got_first.items()}  # fmt: skip
            got_first["attention"] = [
                [r[: len(first["source_tokens"][0])] for r in m[: len(first["target_tokens"][0])]]
                for m in got_first["attention"]
            ]
            got_second = {
                k: [row[: len(second[k][0])] for row in v] if k not in flat else v
                for k, v in got_second.items()
            }
            got_second["attention"] = [
                [r[: len(second["source_tokens"][0])] for r in m[: len(second["target_tokens"][0])]]
                for m in got_second["attention"]
            ]
        assert_same(got_first, first, texts)
        assert_same(got_second, second, texts)
    # a prefix starts every hypothesis
    assert results[0]["outputs"][1][0].startswith("Ein")
    assert all(text.startswith("Zwei") for text in results[1]["outputs"][0])


def greedy_requests(path, trained=None):
    return [{
        "signature": "translate_with_options", "inputs": SOURCES,
        "options": options(len(SOURCES), beam_size=1, alpha=0.0)}]  # fmt: skip


def greedy_targets(trained):
    """The in-process beam-1 translations of SOURCES (those of the `greedy` request: checked
    below), as the client sends them, so that one TF1 session scores them."""
    one = trained[2](beam_size=1, alpha=0.0, max_extra_length=10)
    texts = [t.decode() for t in one(tf.constant(SOURCES))["outputs"].numpy()]
    return texts, [t.encode("utf-8").decode("latin-1") for t in texts]


def score_greedy_requests(path, trained):
    return [
        {
            "signature": "score",
            "inputs": SOURCES,
            "options": {"targets": greedy_targets(trained)[1]},
        }
    ]


def test_score_gives_the_search_its_own_score_and_aligns(trained, session):
    """For beam 1 / alpha 0 translations, `score` returns the search's log-probability (to
    1e-3, where re-tokenizing gives the same pieces); its pieces end with eos, its token
    scores sum to the score and its attention rows are distributions over the source."""
    source = SOURCES
    (greedy,) = session["greedy"]
    targets = [row[0] for row in greedy["outputs"]]
    assert targets == greedy_targets(trained)[0]  # what `score_greedy` scored
    (scored,) = session["score_greedy"]
    model, tokenizer, translator_with = trained
    translator = translator_with(beam_size=1, alpha=0.0, max_extra_length=10)
    ids, *_ = translator.search(tf.constant(source), 1)
    checked = 0
    for i, target in enumerate(targets):
        pieces = [p for p in scored["target_tokens"][i] if p]
        assert pieces[-1] == "</s>"
        n = len(pieces)
        assert sum(scored["token_scores"][i][:n]) == pytest.approx(scored["scores"][i], abs=1e-4)
        retokenized = tokenizer.tokenize(tf.constant([target]))[0].numpy().tolist() + [EOS_ID]
        searched = ids[i, 0].numpy().tolist()
        if searched[: len(retokenized)] == retokenized:
            assert scored["scores"][i] == pytest.approx(greedy["scores"][i][0], abs=1e-3)
            checked += 1
        rows = np.array(scored["attention"][i])[:n]
        s = len([p for p in scored["source_tokens"][i] if p])
        np.testing.assert_allclose(rows[:, :s].sum(-1), 1.0, atol=1e-4)
        assert not rows[:, s:].any()
    del checked  # the 30-step model's outputs rarely re-tokenize the same: ids checked below
    # the same at the level of ids, for every sentence: forced decoding of the search's own
    # tokens sums to the search's score
    source_ids, *_ = translator._encode_inputs(tf.constant(source))
    for i in range(len(source)):
        tokens = ids[i, 0].numpy().tolist()
        tokens = tokens[: tokens.index(EOS_ID) + 1]
        logits, _ = model.forced_decode(
            source_ids[i : i + 1], tf.constant([[BOS_ID] + tokens[:-1]])
        )
        log_probs = tf.nn.log_softmax(logits[0]).numpy()
        total = sum(log_probs[t, token] for t, token in enumerate(tokens))
        assert total == pytest.approx(greedy["scores"][i][0], abs=1e-3)


def sample_requests(path, trained=None):
    n = len(SOURCES)

    def sample(seed, top_k=0, temperature=1.0):
        return {"signature": "sample", "inputs": SOURCES, "options": {
            "temperature": [temperature] * n, "top_k": [top_k] * n, "top_p": [1.0] * n,
            "seed": [seed + i for i in range(n)]}}  # fmt: skip

    greedy = {"signature": "translate_with_options", "inputs": SOURCES,
              "options": options(n, beam_size=1, alpha=0.0)}  # fmt: skip
    return [sample(0, top_k=1, temperature=0.5), sample(1), sample(1), sample(50), greedy]


def test_sample_top_k_one_is_greedy_and_seeds_reproduce(session):
    top1, again, same, other, beam1 = session["sample"]
    assert top1["outputs"] == [row[0] for row in beam1["outputs"]]
    assert top1["scores"] == pytest.approx([row[0] for row in beam1["scores"]], abs=1e-4)
    assert again == same and again["outputs"] != other["outputs"]


@pytest.mark.parametrize("options_, name", BAD_SAMPLING)
def test_bad_sampling_options_are_invalid_argument_errors_naming_the_input(
    bad_results, options_, name
):
    result = bad_results[json.dumps(bad_sampling_request(options_), sort_keys=True)]
    assert f"sample: input {name} must be" in result["error"]


SCORE_TARGETS = ["Ein Mann fährt.", "Zwei Hunde.", "", "Ein Mädchen.", "Zwei Männer.", "Hunde."]


def score_cli_requests(path, trained=None):
    as_sent = [t.encode("utf-8").decode("latin-1") for t in SCORE_TARGETS]  # the client's bytes
    return [{"signature": "score", "inputs": SOURCES, "options": {"targets": as_sent}}]


def test_score_cli_writes_json_lines_in_input_order(session, commands):
    out = commands[1]["score"]  # --batch-size 2
    lines = [json.loads(line) for line in text(out).splitlines()]
    (expected,) = session["score_cli"]
    assert [line["score"] for line in lines] == pytest.approx(expected["scores"], abs=1e-3)
    for line in lines:
        assert line["target_tokens"][-1] == "</s>"
        assert len(line["alignment"]) == len(line["token_scores"]) == len(line["target_tokens"])
        assert all(0 <= j < len(line["source_tokens"]) for j in line["alignment"])


def test_translate_samples_and_completes_prefixes(commands):
    completed = text(commands[1]["prefixes"]).splitlines()
    assert len(completed) == len(PREFIXES)
    for line, prefix in zip(completed, PREFIXES):
        assert line.startswith(prefix)
    # --sample-topk 5 --temperature 1.2 with each (seed, batch size)
    sampled = [text(commands[1][f"sample-{seed}-{batch}"]) for seed, batch in SAMPLINGS]
    assert sampled[0] == sampled[1] != sampled[2]  # the seed, not the batching, decides


INVALID_UTF8 = (
    "\n".join([*SENTENCES, " ".join(["word"] * 700)]) + "\n"
).encode() + b"caf\xc3 \xff broken\nA dog.\n"


def test_translate_replaces_invalid_utf8_on_stdin_as_in_files(commands):
    """Invalid UTF-8 is replaced on stdin as in a file; and (the kt-translate part of
    test_commands_report_the_inputs_cut_on_stderr, on the same runs) a 700-word line does
    not fit the model's 64 positions: kt-translate says how many inputs were cut."""
    n = len(SENTENCES) + 3
    assert INVALID_UTF8.count(b"\n") == n and b"caf\xc3 \xff" in INVALID_UTF8
    from_stdin = commands[1]["stdin"]
    from_file = commands[1]["invalid_utf8_file"]
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert text(from_stdin) == text(from_file)
    note = f"warning: 1 of {n} inputs were longer than the export's limit"
    assert f"kt-translate: {note}" in from_file.stderr
    assert len(text(from_file).splitlines()) == n


def test_client_fills_per_sentence_vectors_with_the_librarys_defaults():
    import importlib.util

    spec = importlib.util.spec_from_file_location("client", os.path.join(ROOT, "serving/client.py"))
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    defaults = client.DEFAULT_OPTIONS
    assert (defaults["beam_size"], defaults["alpha"], defaults["max_extra_length"]) == (
        config.BEAM_SIZE,
        config.ALPHA,
        config.MAX_EXTRA_LENGTH,
    )
    vectors = client.per_sentence({**defaults, "beam_size": 8}, 3)
    assert vectors["beam_size"] == [8, 8, 8] and vectors["target_prefix"] == ["", "", ""]
    # 0.1.0's six inputs go to translate_with_options; a stop rule to its own signature
    assert sorted(defaults) == sorted(WARMUP_OPTIONS["translate_with_options"])
    assert client._signature(defaults) == "translate_with_options"
    assert client._signature({**defaults, "stop_rule": "top"}) == "translate_with_stop_rule"
    assert client._signature(None) == "serving_default"


def test_tokenization_is_pinned_to_the_cpu_in_the_graph(exported):
    """SentencePiece has CPU kernels only: every tokenize / detokenize / id-to-piece node of
    the SavedModel's GraphDef (its functions included) must carry a CPU device, so that the
    export places on a GPU server."""
    from tensorflow.core.protobuf import saved_model_pb2

    _, _, path = exported
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    meta = saved.meta_graphs[0]
    graph = meta.graph_def
    # The TF2 loader re-creates the model resource by calling its `_creator` function on the
    # saved resource's own device (checked below); every other node carries its device.
    functions = [f for f in graph.library.function if "_creator" not in f.signature.name]
    nodes = list(graph.node) + [n for f in functions for n in f.node_def]
    ops = (
        "SentencepieceOp",  # the model resource, as TF Serving's TF1 loader creates it
        "SentencepieceTokenizeOp",
        "SentencepieceDetokenizeOp",
        "SentencepieceIdToStringOp",
    )
    found = [n for n in nodes if n.op in ops]
    assert {n.op for n in found} == set(ops)
    assert all("CPU:0" in n.device for n in found), {(n.op, n.device) for n in found}
    resources = [n.resource for n in meta.object_graph_def.nodes if n.HasField("resource")]
    assert resources and all("CPU:0" in r.device for r in resources), resources


def test_commands_report_the_inputs_cut_on_stderr(commands):
    """A 700-word line does not fit the model's 64 positions: kt-evaluate and kt-score say
    how many inputs were cut (one line on stderr), and kt-evaluate's JSON too (kt-translate:
    test_translate_replaces_invalid_utf8_on_stdin_as_in_files)."""
    n = len(SENTENCES) + 1
    assert len((commands[0] / "cut.txt").read_text().splitlines()) == n
    note = f"warning: 1 of {n} inputs were longer than the export's limit"
    out = commands[1]["evaluate_cut"]  # --beam-size 1
    assert out.returncode == 0 and f"kt-evaluate: {note}" in out.stderr
    assert json.loads(out.stdout)["truncated_inputs"] == 1
    out = commands[1]["score_cut"]
    assert out.returncode == 0
    assert f"kt-score: warning: 1 of {n} sources were longer" in out.stderr
    # without a long input, no note: test_translate_keeps_input_order_and_shows_progress


# TF Serving's Predict, emulated in a fresh interpreter that imports only tensorflow and
# tensorflow_text: the SavedModel loaded through a TF1 session, a REST body ({"signature_name",
# "inputs": {name: list}}, the columnar format) checked and fed as predict_util.cc does
# (VerifyRequestInputsSize, then saved_model::GetInputValues: an input the request omits is
# fed the SignatureDef's default as written, or the request is refused), and, for a job of
# several bodies, merged as --enable_batching's BatchingSession merges requests of one
# signature: every fed tensor must have the same 0th dimension, the merged tensors are
# concatenated on axis 0 and run once, the results split back. argv[2]: JSON list of jobs
# (lists of bodies); prints one {"results": [per body]} or {"error"} per job.
TF_SERVING = r"""
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
assert not any(m.startswith("keras_transformer") for m in sys.modules)
tf.compat.v1.disable_eager_execution()


class Refused(Exception):
    pass


def tensor(info, value):
    dtype = tf.dtypes.as_dtype(info.dtype)
    if isinstance(value, np.ndarray):  # a SignatureDef default, as written
        return value
    if dtype == tf.string:
        encode = np.vectorize(lambda s: s.encode("utf-8"), otypes=[object])
        return encode(np.array(value, dtype=object))
    return np.array(value, dtype=dtype.as_numpy_dtype)


def feeds(meta, body):
    name = body.get("signature_name", "serving_default")
    if name not in meta.signature_def:
        raise Refused(f'Serving signature key "{name}" not found.')
    sig = meta.signature_def[name]
    given, wanted = set(body["inputs"]), set(sig.inputs)
    extra, missing = given - wanted, wanted - given - set(sig.defaults)
    if extra or missing:
        raise Refused(
            f"input size does not match signature: Sent extra: {sorted(extra)}. "
            f"Missing but required: {sorted(missing)}."
        )
    values = {
        alias: tensor(info, body["inputs"][alias]) if alias in given
        else tf.make_ndarray(sig.defaults[alias])
        for alias, info in sig.inputs.items()
    }
    sizes = {alias: v.shape[0] if v.ndim else None for alias, v in values.items()}
    if None in sizes.values() or len(set(sizes.values())) != 1:
        raise Refused(
            f"Batching Run() input tensors must have equal 0th-dimension size: {sizes}"
        )
    return sig, values


def plain(array):
    if array.dtype == object:
        return tf.nest.map_structure(lambda o: o.decode("utf-8"), array.tolist())
    return array.tolist()


jobs = json.loads(sys.argv[2])
answers = []
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], sys.argv[1])
    for job in jobs:
        try:
            parsed = [feeds(meta, body) for body in job]
            names = {body.get("signature_name", "serving_default") for body in job}
            assert len(names) == 1, "the batcher merges requests of one signature"
            sig = parsed[0][0]
            merged = {
                sig.inputs[alias].name: np.concatenate([values[alias] for _, values in parsed])
                for alias in sig.inputs
            }
            fetch = {k: v.name for k, v in sig.outputs.items()}
            out = sess.run(fetch, merged)
            results, start = [], 0
            for _, values in parsed:
                size = next(iter(values.values())).shape[0]
                results.append({k: plain(v[start : start + size]) for k, v in out.items()})
                start += size
            answers.append({"results": results})
        except (Refused, tf.errors.InvalidArgumentError) as err:
            answers.append({"error": str(getattr(err, "message", err))[:400]})
print(json.dumps(answers))
"""


def tf_serving(path, jobs):
    """Each job (a list of REST bodies) as TF Serving with --enable_batching answers it."""
    out = subprocess.run(
        [sys.executable, "-c", TF_SERVING, path, json.dumps(jobs)],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def documented_requests():
    """(page, REST body) of every `curl -d '<json>'` in the README's and docs/' bash blocks."""
    from tests.test_docs import PAGES, README, bash_blocks, command_lines

    found = []
    for page in [README, *PAGES]:
        for block in bash_blocks(page):
            for tokens in command_lines(block):
                if tokens[:1] == ["curl"]:
                    body = json.loads(tokens[tokens.index("-d") + 1])
                    found.append((os.path.relpath(page, ROOT), body))
    return found


def documented_jobs(requests):
    """Each documented request alone, merged with itself, and cut to its first sentence."""
    first = [{**b, "inputs": {k: v[:1] for k, v in b["inputs"].items()}} for _, b in requests]
    jobs = [[body] for _, body in requests] + [[b, b] for _, b in requests]
    return jobs + [[body] for body in first]


STOP_RULE_BODY = {"signature_name": "translate_with_stop_rule", "inputs": {
    "inputs": ["A dog.", "A cat."], "beam_size": [2, 2], "alpha": [0.6, 0.6],
    "max_extra_length": [5, 5], "num_hypotheses": [1, 1], "target_prefix": ["", ""],
    "stop_rule": ["", "top"]}}  # fmt: skip


def refused_jobs():
    """A fine request, then the same without stop_rule, with an extra input, and uneven."""
    body = STOP_RULE_BODY
    without = {**body, "inputs": {k: v for k, v in body["inputs"].items() if k != "stop_rule"}}
    extra = {**body, "inputs": {**body["inputs"], "seed": [1, 2]}}
    uneven = {**body, "inputs": {**body["inputs"], "stop_rule": [""]}}
    return [[body], [without], [extra], [uneven]]


@pytest.fixture(scope="module")
def serving_answers(fresh_process):
    """The emulated server's answers to the jobs of the two tests below, from one process
    (`fresh_process`): (documented_jobs' answers, refused_jobs' answers)."""
    answers, documented = answer_of(fresh_process["serving"]), fresh_process["documented"]
    assert len(answers) == documented + len(refused_jobs())
    return answers[:documented], answers[documented:]


def test_every_documented_request_runs_under_tf_servings_rules(serving_answers):
    """Every REST request of the docs, sent as written to a fresh export under TF Serving's
    rules (every input present unless the SignatureDef has a default; every fed input of one
    0th dimension, the batcher's rule), is answered; and merged with itself, as the batcher
    merges two requests, it gets the same answer twice. 0.1.0's `translate_with_options`
    request (six inputs) is among them."""
    requests = documented_requests()
    signatures = {body.get("signature_name", "serving_default") for _, body in requests}
    assert signatures == {
        "serving_default", "translate_nbest", "translate_with_options",
        "translate_with_stop_rule", "score", "sample",
    }  # fmt: skip
    sizes = {len(body["inputs"]["inputs"]) for _, body in requests}
    assert 1 in sizes and max(sizes) > 1  # one sentence and several
    answers = serving_answers[0]
    assert len(answers) == 3 * len(requests)
    n = len(requests)
    alone, merged, one = answers[:n], answers[n : 2 * n], answers[2 * n :]
    for (page, body), single, double, cut in zip(requests, alone, merged, one, strict=True):
        assert "error" not in single, (page, body, single)
        assert "error" not in double, (page, body, double)
        for got in double["results"]:
            assert_same(got, single["results"][0], ("outputs", "target_tokens", "source_tokens"))
        # its first sentence alone (a request of one sentence, with and without stop_rule)
        assert "error" not in cut, (page, body, cut)
        assert len(cut["results"][0]["truncated"]) == 1  # every signature returns it


def test_the_emulated_server_refuses_what_tf_serving_refuses(serving_answers, tmp_path):
    """The rules above can fail: a missing input without a default, an extra input, inputs of
    different 0th dimensions. And why `stop_rule` is a signature of its own, not a default:
    TF 2.21 writes a `tf.function` argument's Tensor default into the SignatureDef (one value,
    shape [1]), which TF Serving feeds as it is, so a request of one sentence works and a
    request of several is refused by the batcher."""
    fine, missing, sent_extra, batched = serving_answers[1]
    assert len(fine["results"][0]["outputs"]) == 2
    assert "Missing but required: ['stop_rule']" in missing["error"]
    assert "Sent extra: ['seed']" in sent_extra["error"]
    assert "equal 0th-dimension size" in batched["error"]

    class WithDefault(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")] * 2)
        def f(self, inputs, stop_rule=tf.constant([""])):
            return {"outputs": tf.strings.join([inputs, stop_rule])}

    module = WithDefault()
    tf.saved_model.save(module, str(tmp_path / "default"), signatures={"serving_default": module.f})
    one, several = tf_serving(
        str(tmp_path / "default"),
        [[{"inputs": {"inputs": ["a"]}}], [{"inputs": {"inputs": ["a", "b"]}}]],
    )
    assert one == {"results": [{"outputs": ["a"]}]}
    assert "equal 0th-dimension size" in several["error"]


def test_export_run_keeps_the_keyword_names_of_0_1(tmp_path):
    """export_run's keywords are those it had before ExportArgs (use_best, ema, export_format),
    each mapped to its kt-export flag: use_best=True, ema=False on a run that recorded
    --ema-decay is refused before any weight is read, as kt-export --best --no-ema is."""
    import inspect

    from keras_transformer.run_dir import Run

    names = set(inspect.signature(export_run).parameters)
    assert {"use_best", "ema", "export_format", "quantization"} <= names
    assert not {"best", "no_ema", "format"} & names
    cfg = config.TransformerConfig.preset("tiny", vocab_size=100)
    Run(str(tmp_path / "run")).write_config(
        {"model": cfg.to_dict(), "training": {"ema_decay": 0.999}}
    )
    with pytest.raises(ExportError, match="--best --no-ema"):
        export_run(str(tmp_path / "run"), str(tmp_path / "exports"), use_best=True, ema=False)
    assert not os.path.exists(tmp_path / "exports")


# The requests of every test that asks the TF1 session (`session`): one process answers all,
# the warmup records first (as TF Serving replays them when it loads the model).
REQUESTS = {
    "warmup": warmup_requests,
    "fresh_process": fresh_process_requests,
    "with_options": with_options_requests,
    "bad": bad_requests,
    "batching": batching_requests,
    "greedy": greedy_requests,
    "sample": sample_requests,
    "score_cli": score_cli_requests,
    "score_greedy": score_greedy_requests,
}
