"""`Translator(xla=True)` and its export (`kt-export --xla`): the outputs of the default
search, through a TF1 session in a fresh process (as TF Serving runs it), and warmup requests
that compile every shape a request of at most `xla_max_batch` sentences needs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.inference.agreement import REPORT_FILE
from keras_transformer.inference.export import AVERAGE_LAST, export_run, export_translator
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import load_trained
from tests.run_fixture import make_run

SENTENCES = [
    "A man is riding a bike.",
    "Two dogs play in the snow near a red house with a big garden.",
    "A girl.",
    "",
    "People walk.",
]
# short inputs (16 tokens, outputs up to 26: 2 cache capacities) and requests of at most 2
# sentences keep the compiled shapes few: 2 batches x 2 capacities x 2 beams
LIMITS = dict(max_extra_length=10, max_input_length=16)
MAX_BATCH = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory, multi30k_dir):
    """A small run whose config.json names its dataset (as train.py writes it); one layer:
    XLA compiles every search here, in less time the fewer layers."""
    return make_run(str(tmp_path_factory.mktemp("run")), multi30k_dir, named=True, num_layers=1)


@pytest.fixture(scope="module")
def translators(run):
    model, tokenizer, _ = load_trained(run, average_last=AVERAGE_LAST)
    return Translator(model, tokenizer, **LIMITS), Translator(model, tokenizer, xla=True, **LIMITS)


def with_options(n):
    return dict(
        beam_size=tf.constant([4, 1, 3, 2, 4][:n]),
        alpha=tf.constant([0.6, 0.0, 1.0, 0.6, 0.0][:n]),
        max_extra_length=tf.constant([10, 3, 7, 10, 5][:n]),
        num_hypotheses=tf.constant([2, 1, 3, 1, 4][:n]),
        target_prefix=tf.constant(["Ein", "", "Zwei Hunde", "", "Ein Mann"][:n]),
        stop_rule=tf.constant(["", "finished", "top", "exact", "top"][:n]),
    )


def assert_same(got, expected):
    np.testing.assert_array_equal(got["outputs"].numpy(), expected["outputs"].numpy())
    np.testing.assert_array_equal(got["truncated"].numpy(), expected["truncated"].numpy())
    np.testing.assert_allclose(got["scores"].numpy(), expected["scores"].numpy(), atol=1e-4)


def test_every_search_signature_equals_the_default_search(translators):
    plain, xla = translators
    # the second and the last are cut to max_input_length tokens: truncated
    inputs = tf.constant([*SENTENCES[:-1], " ".join(["Two dogs play in the snow."] * 4)])
    assert xla(inputs)["truncated"].numpy().tolist() == [False, True, False, False, True]
    assert_same(xla(inputs), plain(inputs))
    assert_same(xla.translate_nbest(inputs), plain.translate_nbest(inputs))
    assert_same(
        xla.translate_with_stop_rule(inputs, **with_options(5)),
        plain.translate_with_stop_rule(inputs, **with_options(5)),
    )


# A fresh interpreter that imports only tensorflow and tensorflow_text and loads SavedModels
# through TF1 sessions, as TF Serving does; argv[1]: JSON list of models {"path", "warmup":
# [requests], "requests": [requests]}, a request {"signature", "inputs": {name: list}}, each
# model loaded in its own graph and session, in order. It counts XLA's compilations (modules
# dumped to $XLA_FLAGS' --xla_dump_to, argv[2]) of each model: after its warmup and after its
# requests, since its load.
TF1_CLIENT = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401
assert not any(m.startswith("keras_transformer") for m in sys.modules)
tf.compat.v1.disable_eager_execution()
models = json.loads(sys.argv[1])
dump = sys.argv[2]

def compiled():
    if not os.path.isdir(dump):
        return 0
    return sum(name.endswith(".before_optimizations.txt") for name in os.listdir(dump))

def value(info, data):
    dtype = tf.dtypes.as_dtype(info.dtype)
    if dtype == tf.string:
        return np.array([s.encode() for s in data], dtype=object)
    return np.array(data, dtype=dtype.as_numpy_dtype)

def plain(array):
    if array.dtype == object:
        return [[x.decode() for x in row] if isinstance(row, list) else row.decode()
                for row in array.tolist()]
    return array.tolist()

def serve(given):
    before = compiled()
    with tf.compat.v1.Session(graph=tf.Graph()) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], given["path"])

        def run(request):
            sig = meta.signature_def[request["signature"]]
            fetch = {k: v.name for k, v in sig.outputs.items()}
            feed = {sig.inputs[k].name: value(sig.inputs[k], v)
                    for k, v in request["inputs"].items()}
            return {k: plain(v) for k, v in sess.run(fetch, feed).items()}

        for request in given["warmup"]:
            run(request)
        after_warmup = compiled() - before
        results = [run(request) for request in given["requests"]]
    return {"signatures": sorted(meta.signature_def), "results": results,
            "compiled": [after_warmup, compiled() - before]}

print(json.dumps([serve(given) for given in models]))
"""


def tf1_sessions(models, dump):
    """The client's answer for each model {"path", "warmup", "requests"}, from one process."""
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}"}
    out = subprocess.run(
        [sys.executable, "-c", TF1_CLIENT, json.dumps(models), str(dump)],
        capture_output=True, text=True, check=True, cwd="/", env=env,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def warmup_requests(path):
    """The export's warmup records as the client's requests (as TF Serving replays them)."""
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    file = os.path.join(path, "assets.extra", "tf_serving_warmup_requests")
    for record in tf.data.TFRecordDataset(file):
        request = prediction_log_pb2.PredictionLog.FromString(record.numpy()).predict_log.request
        inputs = {}
        for name, proto in request.inputs.items():
            array = tf.make_ndarray(proto)
            inputs[name] = [x.decode() for x in array] if array.dtype == object else array.tolist()
        requests.append({"signature": request.model_spec.signature_name, "inputs": inputs})
    return requests


def is_compiled_by_xla(path):
    """Whether the SavedModel holds a function XLA must compile."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as handle:
        saved.ParseFromString(handle.read())
    library = saved.meta_graphs[0].graph_def.library
    return any(f.attr["_XlaMustCompile"].b for f in library.function)


@pytest.mark.slow
def test_xla_export_warms_up_every_shape_and_equals_the_default_export(translators, tmp_path):
    plain, xla = translators
    exports = str(tmp_path / "exports")
    plain_path = export_translator(plain, exports, model_name="plain")
    xla_path = export_translator(xla, exports, model_name="xla", xla_max_batch=MAX_BATCH)
    assert not is_compiled_by_xla(plain_path) and is_compiled_by_xla(xla_path)
    warmup = warmup_requests(xla_path)
    shapes = [
        row for r in warmup if r["signature"] == "xla_warmup" for row in r["inputs"]["shapes"]
    ]
    # [P, C, S, K, W]: batches 1 and 2, capacities 16 and 32, sources padded to 16
    assert sorted(map(tuple, shapes)) == [
        (p, c, 16, k, 1) for p in (1, 2) for c in (16, 32) for k in (1, 4)
    ]
    # every request of at most 2 sentences, any length (the longest is cut to 16 tokens)
    longest = " ".join(["Two dogs play in the snow near a red house."] * 3)
    requests = [
        {"signature": signature, "inputs": {"inputs": batch}}
        for signature in ("serving_default", "translate_nbest")
        for batch in ([SENTENCES[0]], SENTENCES[1:3], [longest, SENTENCES[4]], [""])
    ]
    options = {k: v.numpy().tolist() for k, v in with_options(2).items()}
    options["beam_size"] = [4, 1]  # the beams the warmup compiled for
    options["target_prefix"] = ["", ""]
    options["stop_rule"] = ["", "finished"]  # strings as the client sends them (not bytes)
    requests.append(
        {"signature": "translate_with_stop_rule", "inputs": {"inputs": SENTENCES[:2], **options}}
    )
    # one process, as one server serves both: the default export first, then the XLA one
    reference, served = tf1_sessions(
        [dict(path=plain_path, warmup=[], requests=requests),
         dict(path=xla_path, warmup=warmup, requests=requests)],
        tmp_path / "dump",
    )  # fmt: skip
    assert reference["compiled"] == [0, 0]  # the default export never uses XLA
    assert "xla_warmup" in served["signatures"]
    after_warmup, after_requests = served["compiled"]
    assert after_warmup >= len(shapes)  # the shapes, and whatever else XLA compiled
    assert after_requests == after_warmup, "a request compiled a shape the warmup did not"
    for got, expected in zip(served["results"], reference["results"], strict=True):
        assert got["outputs"] == expected["outputs"]
        np.testing.assert_allclose(got["scores"], expected["scores"], atol=1e-4)


def test_docker_compose_serves_xla_exports_with_the_flags_they_need():
    import yaml

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "serving", "docker-compose.yml")) as handle:
        services = yaml.safe_load(handle)["services"]
    default = services["tfserving"]
    assert "profiles" not in default  # `docker compose up` starts the default server only
    assert not any("xla" in flag for flag in default["command"])
    for name, flag in (
        ("tfserving-xla", "--xla_cpu_compilation_enabled=true"),
        ("tfserving-gpu", "--xla_gpu_compilation_enabled=true"),
    ):
        service = services[name]
        assert service["profiles"] and flag in service["command"]
        assert "--enable_model_warmup=true" in service["command"]
    image = services["tfserving-gpu"]["image"]
    assert image.endswith("-gpu") and "latest" not in image  # pinned


@pytest.mark.slow
def test_the_agreement_report_compares_the_xla_export_with_the_reference(run, tmp_path):
    """export_run(xla=True): the report compares the SavedModel as written (compiled by XLA
    when loaded) with the reference search, and says the export is an XLA one."""
    path = export_run(
        run, str(tmp_path / "exports"), max_extra_length=10, xla=True,
        xla_max_batch=1, agreement_sentences=8,
    )  # fmt: skip
    assert is_compiled_by_xla(path)
    with open(os.path.join(path, "assets.extra", REPORT_FILE)) as handle:
        report = json.load(handle)
    assert report["export"]["xla"] is True and report["is_reference"] is False
    assert report["sentences"] == 8 and report["identical"] == 8
    assert report["bleu"]["delta"] == 0
