import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import config
from keras_transformer.config import BOS_ID, EOS_ID
from keras_transformer.inference.export import (
    AVERAGE_LAST,
    ExportError,
    export_run,
    models_config,
    warmup_record,
)
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import load_trained
from tests.inference import reference
from tests.run_fixture import make_run

SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl."]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs in a fresh interpreter that imports only tensorflow and tensorflow_text, loading the
# SavedModel through a TF1 session and its SignatureDefs, as TF Serving does. argv[2] is a
# JSON list of requests: {"signature": name, "inputs": [str], "options": {name: scalar}}.
TF1_CLIENT = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
assert not any(m.startswith("keras_transformer") for m in sys.modules)
tf.compat.v1.disable_eager_execution()
requests = json.loads(sys.argv[2])
results = []
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], sys.argv[1])
    signatures = {
        name: {"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs)}
        for name, sig in meta.signature_def.items()
    }
    for request in requests:
        sig = meta.signature_def[request.get("signature", "serving_default")]
        fetch = {k: v.name for k, v in sig.outputs.items()}
        feed = {sig.inputs["inputs"].name: [s.encode("latin-1") for s in request["inputs"]]}
        for name, value in request.get("options", {}).items():
            feed[sig.inputs[name].name] = value
        try:
            out = sess.run(fetch, feed)
            results.append({"outputs": tf.nest.map_structure(
                                lambda o: o.decode("utf-8"), out["outputs"].tolist()),
                            "scores": out["scores"].tolist()})
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


@pytest.fixture(scope="module")
def exported(tmp_path_factory, multi30k_dir):
    base = tmp_path_factory.mktemp("serving")
    run = make_run(str(base / "run"), multi30k_dir)
    path = export_run(run, str(base / "exports"), model_name="transformer", max_extra_length=10)
    return run, str(base / "exports"), path


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


def test_next_version_and_no_overwrite(exported):
    run, export_dir, _ = exported
    second = export_run(run, export_dir, max_extra_length=10, beam_size=1)
    assert second.endswith(os.path.join("transformer", "2"))
    with pytest.raises(ExportError, match="already exists"):
        export_run(run, export_dir, version=1)


def test_tf1_session_in_a_fresh_process_matches_the_translator(exported):
    run, _, path = exported
    weird = ["", "   ", "caf\xc3 \xff broken", " ".join(["word"] * 700)]  # latin-1 -> raw bytes
    result = tf1_session(path, [{"inputs": SENTENCES}, {"inputs": weird}, {"inputs": []}])
    assert result["signatures"]["serving_default"] == {
        "inputs": ["inputs"],
        "outputs": ["outputs", "scores"],
    }
    assert result["signatures"]["translate_with_options"] == {
        "inputs": ["alpha", "beam_size", "inputs", "max_extra_length", "num_hypotheses"],
        "outputs": ["outputs", "scores"],
    }
    model, tokenizer, _ = load_trained(run, average_last=AVERAGE_LAST)
    expected = Translator(model, tokenizer, max_extra_length=10)(tf.constant(SENTENCES))
    assert result["results"][0]["outputs"] == [s.decode() for s in expected["outputs"].numpy()]
    assert result["results"][0]["scores"] == pytest.approx(
        expected["scores"].numpy().tolist(), abs=1e-4
    )
    weird_out = result["results"][1]
    assert weird_out["outputs"][:2] == ["", ""] and len(weird_out["outputs"]) == 4
    assert result["results"][2] == {"outputs": [], "scores": []}


def options(beam_size=4, alpha=0.6, max_extra_length=10, num_hypotheses=1):
    return {
        "beam_size": beam_size,
        "alpha": alpha,
        "max_extra_length": max_extra_length,
        "num_hypotheses": num_hypotheses,
    }


def test_translate_with_options_through_a_tf1_session(exported):
    """Each option does what it says, per request, in a process without keras_transformer."""
    run, _, path = exported
    source = SENTENCES + ["A little girl climbs into a wooden playhouse.", "A dog runs."]
    with_options = lambda **kw: {  # noqa: E731
        "signature": "translate_with_options",
        "inputs": source,
        "options": options(**kw),
    }
    requests = [
        {"inputs": source},  # serving_default, exported with beam 4, alpha 0.6, +10
        with_options(),
        with_options(beam_size=1, alpha=0.0, max_extra_length=6),
        with_options(beam_size=6, alpha=0.0, num_hypotheses=6),
        with_options(beam_size=6, alpha=1.5, num_hypotheses=6),
        with_options(beam_size=5, num_hypotheses=3),
    ]
    default, same, greedy, short_pref, long_pref, three = tf1_session(path, requests)["results"]
    # the export's own settings through the options signature: serving_default's result
    assert [row[0] for row in same["outputs"]] == default["outputs"]
    assert [row[0] for row in same["scores"]] == pytest.approx(default["scores"], abs=1e-5)

    model, tokenizer, _ = load_trained(run, average_last=AVERAGE_LAST)
    translator = Translator(model, tokenizer, beam_size=1, alpha=0.0, max_extra_length=6)
    source_ids, _, empty = translator._encode_inputs(tf.constant(source))
    lengths = tf.reduce_sum(tf.cast(source_ids > 0, tf.int32), 1) + 6
    ids, _ = reference.model_greedy(model, source_ids, lengths.numpy(), BOS_ID, EOS_ID)
    expected = translator._detokenize(tf.constant(ids)[:, tf.newaxis], empty)[:, 0].numpy()
    assert [row[0] for row in greedy["outputs"]] == [t.decode() for t in expected]  # beam 1

    # num_hypotheses shapes the output; the n best are sorted
    assert [len(row) for row in three["outputs"]] == [3] * len(source)
    assert all(np.all(np.diff(row) <= 1e-6) for row in three["scores"])

    # alpha, per request: the n-best lists are those of translators built with that alpha
    for result, alpha in ((short_pref, 0.0), (long_pref, 1.5)):
        built = Translator(model, tokenizer, beam_size=6, alpha=alpha, max_extra_length=10)
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


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(beam_size=0), "beam_size"),
        (dict(alpha=-1.0), "alpha"),
        (dict(beam_size=2, num_hypotheses=3), "num_hypotheses"),
        (dict(max_extra_length=0), "max_extra_length"),
    ],
)
def test_bad_options_are_invalid_argument_errors_naming_the_input(exported, bad, name):
    _, _, path = exported
    request = {"signature": "translate_with_options", "inputs": SENTENCES, "options": options()}
    request["options"].update(bad)
    (result,) = tf1_session(path, [request])["results"]
    assert f"translate_with_options: input {name} must be" in result["error"]


def test_saved_model_cli_run(exported):
    _, _, path = exported
    cli = (
        "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
        "sys.argv = ['saved_model_cli'] + sys.argv[1:]; saved_model_cli.main()"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            cli,
            "run",
            "--dir",
            path,
            "--tag_set",
            "serve",
            "--signature_def",
            "translate_nbest",
            "--input_exprs",
            'inputs=["A girl.", ""]',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert (
        "Result for output key outputs" in out.stdout
        and "Result for output key scores" in out.stdout
    )


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


def test_export_cli_names_a_bad_model_dir(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "export.py"),
            "--model-dir",
            str(tmp_path / "nope"),
            "--export-dir",
            str(tmp_path / "exports"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "config.json not found" in out.stderr and "Traceback" not in out.stderr


def run_module(*args, **kwargs):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, **kwargs
    )


def test_export_cli_merges_models_config_and_says_what_it_wrote(exported, tmp_path):
    run, _, _ = exported
    export_dir = tmp_path / "exports"
    export_dir.mkdir()
    (export_dir / "models.config").write_text(OTHER_MODELS)
    out = run_module("export.py", "--model-dir", run, "--export-dir", str(export_dir), check=True)
    path = str(export_dir / "transformer" / "1")
    assert f"{path}: " in out.stdout and "MiB on disk" in out.stdout
    assert os.path.join(path, "saved_model.pb") in out.stdout
    assert (
        "signature translate_with_options: (alpha float32[], beam_size int32[], "
        "inputs string[None], max_extra_length int32[], num_hypotheses int32[]) -> "
        "(outputs string[None, None], scores float32[None, None])"
    ) in out.stdout
    assert "signature serving_default: (inputs string[None]) -> (outputs string[None]" in (
        out.stdout
    )
    config = (export_dir / "models.config").read_text()
    assert config == models_config("transformer", "/models/transformer", OTHER_MODELS)


def test_export_defaults_are_the_librarys():
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_cli", os.path.join(ROOT, "export.py"))
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    args = cli.parse_args(["--model-dir", "r", "--export-dir", "e"])
    assert (args.beam_size, args.alpha, args.max_extra_length) == (
        config.BEAM_SIZE,
        config.ALPHA,
        config.MAX_EXTRA_LENGTH,
    )
    assert args.average_last == AVERAGE_LAST == 5


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--beam-size", "0"], "--beam-size: beam_size must be in [1, 64], got 0"),
        (["--alpha", "-1"], "--alpha: alpha must be a finite number >= 0, got -1.0"),
        (["--version", "0"], "--version must be >= 1, got 0"),
    ],
)
def test_export_cli_names_a_bad_flag(tmp_path, flags, message):
    out = run_module(
        "export.py", "--model-dir", str(tmp_path), "--export-dir", str(tmp_path), *flags
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"export.py: error: {message}"


SOURCES = SENTENCES + [
    "A little girl climbs into a wooden playhouse.",
    "Two young guys with shaggy hair look at their hands while hanging out in the yard.",
    "Dogs.",
]


def test_translate_keeps_input_order_and_shows_progress(exported, tmp_path):
    run, _, path = exported
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SOURCES) + "\n")
    out = run_module(
        "-m", "keras_transformer.inference.translate", "--model", path, "--input", str(src),
        "--batch-size", "2", check=True,
    )  # fmt: skip
    model, tokenizer, _ = load_trained(run, average_last=AVERAGE_LAST)
    expected = Translator(model, tokenizer, max_extra_length=10)(tf.constant(SOURCES))
    # batched by length (not input order), written back in input order
    assert out.stdout.splitlines() == [t.decode() for t in expected["outputs"].numpy()]
    assert f"{len(SOURCES)}/{len(SOURCES)}" in out.stderr  # the progress bar
    # per-request options: beam 1 through translate_with_options
    greedy = run_module(
        "-m", "keras_transformer.inference.translate", "--model", path, "--input", str(src),
        "--beam-size", "1", "--alpha", "0", "--max-extra-length", "10", check=True,
    )  # fmt: skip
    one = Translator(model, tokenizer, beam_size=1, alpha=0.0, max_extra_length=10)
    expected = one(tf.constant(SOURCES))["outputs"].numpy()
    assert greedy.stdout.splitlines() == [t.decode() for t in expected]


def test_evaluate_scores_the_translations_in_order(exported, tmp_path):
    from keras_transformer.inference.evaluation import score

    run, _, path = exported
    src, ref = tmp_path / "in.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(SOURCES) + "\n")
    references = list(reversed(SOURCES))  # any fixed references: the BLEU must be theirs
    ref.write_text("\n".join(references) + "\n")
    out = run_module(
        "-m", "keras_transformer.inference.evaluate", "--model", path, "--src", str(src),
        "--ref", str(ref), "--batch-size", "4", check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    model, tokenizer, _ = load_trained(run, average_last=AVERAGE_LAST)
    hyps = Translator(model, tokenizer, max_extra_length=10)(tf.constant(SOURCES))["outputs"]
    expected = score([h.decode() for h in hyps.numpy()], references)
    assert result["bleu"] == expected["bleu"] and result["chrf"] == expected["chrf"]
    assert result["sentences"] == len(SOURCES) and result["target_tokens_per_s"] > 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--ref", "{missing}"], "{missing} not found"),
        (["--beam-size", "0"], "--beam-size: beam_size must be in [1, 64], got 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--model", "{tmp}"], "no saved_model.pb in {tmp}: is it an export version?"),
    ],
)
def test_evaluate_names_the_bad_flag_or_file(exported, tmp_path, flags, message):
    _, _, path = exported
    src = tmp_path / "in.txt"
    src.write_text("A girl.\n")
    fill = {"missing": str(tmp_path / "nope.txt"), "tmp": str(tmp_path)}
    argv = ["--model", path, "--src", str(src), "--ref", str(src)]
    argv += [f.format(**fill) for f in flags]
    out = run_module("-m", "keras_transformer.inference.evaluate", *argv)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"evaluate: error: {message.format(**fill)}"
