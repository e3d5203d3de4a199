import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_transformer.run_dir import load_trained
from keras_transformer.serving import ExportError, export_run, warmup_record
from keras_transformer.translator import Translator
from tests.run_fixture import make_run

SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A girl."]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in a fresh interpreter that imports only tensorflow and tensorflow_text, loading the
# SavedModel through a TF1 session and the serving_default SignatureDef, as TF Serving does.
TF1_CLIENT = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
assert not any(m.startswith("keras_transformer") for m in sys.modules)
tf.compat.v1.disable_eager_execution()
batches = json.loads(sys.argv[2])
results = []
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], sys.argv[1])
    sig = meta.signature_def["serving_default"]
    fetch = {k: v.name for k, v in sig.outputs.items()}
    for batch in batches:
        feed = [s.encode("latin-1") for s in batch]
        try:
            out = sess.run(fetch, {sig.inputs["inputs"].name: feed})
            results.append({"outputs": [o.decode("utf-8") for o in out["outputs"]],
                            "scores": [float(s) for s in out["scores"]]})
        except tf.errors.InvalidArgumentError as err:
            results.append({"error": err.message[:200]})
print(json.dumps({"inputs": sorted(sig.inputs), "outputs": sorted(sig.outputs), "results": results}))
"""


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
    assert 'name: "transformer"' in config and 'base_path: "/models/transformer"' in config


def test_next_version_and_no_overwrite(exported):
    run, export_dir, _ = exported
    second = export_run(run, export_dir, max_extra_length=10, beam_size=1)
    assert second.endswith(os.path.join("transformer", "2"))
    with pytest.raises(ExportError, match="already exists"):
        export_run(run, export_dir, version=1)


def test_tf1_session_in_a_fresh_process_matches_the_translator(exported):
    run, _, path = exported
    weird = ["", "   ", "caf\xc3 \xff broken", " ".join(["word"] * 700)]  # latin-1 -> raw bytes
    out = subprocess.run(
        [sys.executable, "-c", TF1_CLIENT, path, json.dumps([SENTENCES, weird, []])],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["inputs"] == ["inputs"] and result["outputs"] == ["outputs", "scores"]
    model, tokenizer, _ = load_trained(run)
    expected = Translator(model, tokenizer, max_extra_length=10)(tf.constant(SENTENCES))
    assert result["results"][0]["outputs"] == [s.decode() for s in expected["outputs"].numpy()]
    assert result["results"][0]["scores"] == pytest.approx(
        expected["scores"].numpy().tolist(), abs=1e-4
    )
    weird_out = result["results"][1]
    assert weird_out["outputs"][:2] == ["", ""] and len(weird_out["outputs"]) == 4
    assert result["results"][2] == {"outputs": [], "scores": []}


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


def test_translate_and_evaluate_modules(exported, tmp_path):
    _, _, path = exported
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "keras_transformer.translate", "--model", path, "--input", str(src)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(lines) + "\n")  # scoring a system against itself gives 100
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_transformer.evaluate",
            "--model",
            path,
            "--src",
            str(src),
            "--ref",
            str(ref),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    result = json.loads(out.stdout)
    assert result["bleu"] == pytest.approx(100.0) and "nrefs:1" in result["bleu_signature"]
