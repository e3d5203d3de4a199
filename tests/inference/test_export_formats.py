"""Export formats and precisions, each checked against the reference: the agreement report,
--dtype, --format ctranslate2, and the package never importing ctranslate2 otherwise."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.inference.agreement import REPORT_FILE
from keras_transformer.inference.export import ExportError, export_run
from tests.inference.test_export import ROOT, run_commands, text, tf1_session
from tests.run_fixture import make_run

SENTENCES = 12


@pytest.fixture(scope="module")
def run(tmp_path_factory, multi30k_dir):
    """A small run whose config.json names its dataset (as train.py writes it); one layer:
    every export here traces, and the agreement reports search, in less time."""
    base = tmp_path_factory.mktemp("formats")
    return make_run(str(base / "run"), multi30k_dir, steps=60, named=True, num_layers=1)


def report_of(path):
    with open(os.path.join(path, "assets.extra", REPORT_FILE)) as handle:
        return json.load(handle)


def test_the_default_export_reports_it_reproduces_the_reference(run, tmp_path, multi30k_dir):
    """float32, exact rule: the SavedModel as written gives the in-process search's outputs
    on the first validation sentences (all identical, BLEU delta 0), the report says so and
    where the sentences came from, and it is an asset TF Serving never reads as a variable."""
    path = export_run(run, str(tmp_path), max_extra_length=10, agreement_sentences=SENTENCES)
    report = report_of(path)
    assert report["is_reference"] is True and report["sentences"] == SENTENCES
    assert report["identical"] == SENTENCES and report["identical_share"] == 1.0
    assert report["bleu"]["delta"] == 0 and report["chrf"]["delta"] == 0
    assert report["data"] == f"the first {SENTENCES} pairs of multi30k validation en->de"
    assert report["export"]["dtype"] == "float32" and report["export"]["stop_rule"] == "exact"
    assert not os.path.exists(os.path.join(path, "variables", REPORT_FILE))
    # TF Serving's loader loads a version directory with the report in assets.extra: the
    # TF1 session of test_a_float16_top_rule_export_computes_in_float16_and_serves_every_rule;
    # without sentences the report says why: test_export.py's test_layout (its export has 0)


def assert_computes_in(path, dtype):
    """--dtype: the SavedModel's matmuls run in that dtype (its graph has them), scores stay
    float32, and the report compares it with the float32 search (not the reference itself)."""
    report = report_of(path)
    assert report["is_reference"] is False and report["export"]["dtype"] == dtype
    assert report["sentences"] == SENTENCES and 0 <= report["identical"] <= SENTENCES
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(path)
    out = loaded.signatures["serving_default"](inputs=tf.constant(["A dog runs."]))
    assert out["scores"].dtype == tf.float32
    graph = loaded.signatures["serving_default"].graph.as_graph_def()
    dtypes = set()
    for function in graph.library.function:
        for node in function.node_def:
            if node.op in ("MatMul", "BatchMatMulV2", "BatchMatMulV3") and "T" in node.attr:
                dtypes.add(tf.dtypes.as_dtype(node.attr["T"].type).name)
    assert dtype in dtypes


@pytest.fixture(scope="module")
def float16(run, tmp_path_factory):
    """One export with both options (each is checked on its own terms): float16 here
    (bfloat16, exported by kt-export: test_export_cli_prints_the_agreement), and the stop
    rule "top" as the export's default, which a request may replace."""
    return export_run(
        run, str(tmp_path_factory.mktemp("float16")), max_extra_length=10, dtype="float16",
        stop_rule="top", agreement_sentences=SENTENCES,
    )  # fmt: skip


FORMAT_BAD = [
    (["--quantization", "int8"], "--quantization applies to --format ctranslate2 only"),
    (["--format", "ctranslate2", "--dtype", "bfloat16"], "--dtype applies to --format"),
    (["--agreement-sentences", "-1"], "--agreement-sentences must be >= 0 (0: skip), got -1"),
]


@pytest.fixture(scope="module")
def commands(run, float16, tmp_path_factory):
    """The file's command runs, from one process tree (tests/cli_driver.py: TensorFlow
    imported once, each command a child forked from that process): kt-translate --stop-rule
    exact on the float16 export, kt-export --dtype bfloat16 and kt-export on each bad format
    flag, each in a folder of its own. (their folder, {name: CompletedProcess})."""
    base = tmp_path_factory.mktemp("commands")
    (base / "in.txt").write_text("A man sleeps.\n")
    (base / "bfloat16").mkdir()
    jobs = {
        "translate": (
            ("-m", "keras_transformer.cli.translate", "--model", float16, "--input",
             str(base / "in.txt"), "--stop-rule", "exact", "--max-extra-length", "10"),
            None,
        ),
        "export": (
            ("export.py", "--model-dir", run, "--export-dir", str(base / "bfloat16"),
             "--max-extra-length", "10", "--agreement-sentences", str(SENTENCES), "--dtype",
             "bfloat16"),
            None,
        ),
    }  # fmt: skip
    for case, (flags, _) in enumerate(FORMAT_BAD):
        folder = base / f"bad-{case}"
        folder.mkdir()
        argv = ("export.py", "--model-dir", str(folder), "--export-dir", str(folder), *flags)
        jobs[f"bad-{case}"] = (argv, None)
    (base / "driver").mkdir()
    return base, run_commands(base / "driver", jobs)


def test_a_float16_top_rule_export_computes_in_float16_and_serves_every_rule(float16, commands):
    path = float16
    assert_computes_in(path, "float16")
    report = report_of(path)
    assert report["export"]["stop_rule"] == "top" and report["is_reference"] is False
    # the export's default, and "" per request, is its rule; a request may ask for another
    requests = [
        {"signature": "translate_with_stop_rule", "inputs": ["A man sleeps."], "options": {
            "beam_size": [4], "alpha": [0.6], "max_extra_length": [10], "num_hypotheses": [1],
            "target_prefix": [""], "stop_rule": [rule]}}
        for rule in ("", "top", "exact")
    ] + [{"inputs": ["A man sleeps."]}]  # fmt: skip
    assert os.path.exists(os.path.join(path, "assets.extra", REPORT_FILE))
    default, top, exact, serving = tf1_session(path, requests)["results"]  # the loader loads it
    assert default == top and serving["outputs"] == [row[0] for row in top["outputs"]]
    assert "error" not in exact
    # kt-translate --stop-rule asks translate_with_stop_rule for it
    out = text(commands[1]["translate"])
    assert out.splitlines() == [row[0] for row in exact["outputs"]]


def test_ctranslate2_export_equals_the_savedmodel_at_greedy(run, tmp_path):
    """--format ctranslate2, float32, beam 1 and alpha 0 (the settings where both searches are
    the same): its outputs on the validation sentences are the float32 search's (agreement
    report: all identical), and the directory holds a CTranslate2 model and spm.model; an
    int8 export loads and reports too (its agreement is what it is)."""
    path = export_run(
        run, str(tmp_path), beam_size=1, alpha=0.0, max_extra_length=10,
        export_format="ctranslate2", agreement_sentences=SENTENCES,
    )  # fmt: skip
    for name in ("model.bin", "config.json", "shared_vocabulary.json", "spm.model"):
        assert os.path.exists(os.path.join(path, name)), name
    report = report_of(path)
    assert report["export"]["format"] == "ctranslate2" and report["is_reference"] is False
    assert report["identical"] == SENTENCES, report
    assert not os.path.exists(os.path.join(str(tmp_path), "models.config"))
    int8 = export_run(
        run, str(tmp_path), max_extra_length=10, export_format="ctranslate2",
        quantization="int8", agreement_sentences=4,
    )  # fmt: skip
    report = report_of(int8)
    assert report["export"]["quantization"] == "int8" and report["sentences"] == 4


def test_the_package_never_imports_ctranslate2_unless_asked():
    """Every module of the package imported (the commands too), and a flag check of
    kt-export with the SavedModel format: ctranslate2 stays unimported."""
    code = (
        "import pkgutil, sys, importlib, keras_transformer\n"
        "for m in pkgutil.walk_packages(keras_transformer.__path__, 'keras_transformer.'):\n"
        "    importlib.import_module(m.name)\n"
        "from keras_transformer.cli import export\n"
        "from keras_transformer.inference.export import exporter\n"
        "args = export.parse_args(['--model-dir', 'r', '--export-dir', 'e'])\n"
        "args.check(); exporter(args).check()\n"
        "assert 'ctranslate2' not in sys.modules, 'imported'\n"
        "args = export.parse_args(['--model-dir', 'r', '--export-dir', 'e', '--format',"
        " 'ctranslate2'])\n"
        "args.check(); exporter(args).check()\n"
        "assert 'ctranslate2' in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout.strip() == "ok"


def test_the_library_refuses_xla_for_a_format_with_its_own_search(tmp_path):
    # The same check as kt-export's flag check, before the (missing) run is read.
    with pytest.raises(ExportError, match="--format ctranslate2 runs its own: drop --xla"):
        export_run(str(tmp_path / "no-run"), str(tmp_path), export_format="ctranslate2", xla=True)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("case", range(len(FORMAT_BAD)), ids=[f[0] for f, _ in FORMAT_BAD])
def test_export_cli_names_a_bad_format_flag(commands, case):
    _, message = FORMAT_BAD[case]
    folder, out = commands[0] / f"bad-{case}", commands[1][f"bad-{case}"]
    assert out.returncode == 2 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"export.py: error: {message}")
    assert not os.listdir(folder)


def test_export_cli_prints_the_agreement(commands):
    """kt-export --dtype bfloat16 prints the agreement, and its export computes in bfloat16
    (the checks of test_a_float16_top_rule_export_computes_in_float16_and_serves_every_rule)."""
    out = text(commands[1]["export"])
    path = os.path.join(str(commands[0] / "bfloat16"), "transformer", "1")
    report = report_of(path)
    line = (
        f"{os.path.join(path, 'assets.extra', REPORT_FILE)}: {report['identical']} of "
        f"{SENTENCES} outputs identical to the float32 exact-rule search's"
    )
    assert line in out
    assert np.isfinite(report["bleu"]["delta"])
    assert_computes_in(path, "bfloat16")
