import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from keras_transformer.training.step import TrainingModel
from keras_transformer.training.strategy import (
    StrategyError,
    check_strategy,
    make_strategy,
    set_precision,
)
from tests.training.scripts import run_scripts, script_result, selected_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the tests whose property needs 2 logical CPUs (or XLA flags) set before TensorFlow starts:
# their scripts (tests/training/*.py, each printing JSON) in processes of their own
SCRIPTS = {
    "test_mirrored_on_two_cpus_equals_one_device": ["replica_equivalence.py"],
    "test_float16_overflow_on_one_replica_skips_the_step_everywhere": ["replica_overflow.py"],
    "test_every_replica_draws_its_own_dropout_masks_reproducibly": ["replica_dropout.py"],
    "test_xla_trains_under_mirrored_and_matches_the_run_without_xla": ["replica_xla.py"],
    "test_xla_compiles_one_program_per_bucket_over_a_pass_of_chunks": ["xla_compiles.py"],
    "test_xla_micro_batches_keep_one_micro_batch_in_memory": ["xla_memory.py"],
}


@pytest.fixture(scope="module")
def scripts(request, tmp_path_factory):
    """The selected tests' scripts, run once in one process tree (one import of TensorFlow
    for all, a forked child each: tests/training/scripts.py); their outcomes by test."""
    commands = {name: list(SCRIPTS[name]) for name in selected_tests(request) & SCRIPTS.keys()}
    compiles = commands.get("test_xla_compiles_one_program_per_bucket_over_a_pass_of_chunks")
    if compiles:
        compiles += [request.getfixturevalue("multi30k_dir"), str(tmp_path_factory.mktemp("xla"))]
    return run_scripts(commands)


def run_script(scripts, test) -> dict:
    """The JSON of `test`'s script (fails the test if the script failed)."""
    return script_result(scripts[test.__name__])


def test_mirrored_on_two_cpus_equals_one_device(scripts):
    result = run_script(scripts, test_mirrored_on_two_cpus_equals_one_device)
    assert result["replicas"] == 2
    assert result["max_update"] > 1e-3  # the step really changed the weights
    assert result["loss_two"] == pytest.approx(result["loss_one"], abs=1e-5)
    assert result["max_weight_diff"] < 1e-5


def micro_model(seed_weights=None):
    cfg = kt.TransformerConfig.preset("tiny", vocab_size=50, dropout_rate=0.0)
    model = kt.Transformer(cfg)
    model.build()
    if seed_weights is not None:
        model.set_weights(seed_weights)
    return model


def test_gradient_accumulation_equals_one_large_batch():
    rng = np.random.default_rng(1)
    src = rng.integers(4, 50, size=(6, 8)).astype("int32")
    tgt = rng.integers(4, 50, size=(6, 6)).astype("int32")
    for row, n in enumerate([6, 5, 2, 6, 1, 3]):
        tgt[row, n:] = 0
    data = tf.data.Dataset.from_tensors(((src, tgt), tgt))
    start = micro_model().get_weights()
    results = []
    for k in (1, 3):
        model = TrainingModel(micro_model(start), accum_steps=k)
        # plain SGD compares the summed gradients themselves (Adam's first step is ~sign(g),
        # which amplifies float noise on near-zero gradients)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=kt.LabelSmoothedCrossEntropy())
        loss = model.fit(data, epochs=1, verbose=0).history["loss"][0]
        results.append((loss, model.transformer.get_weights()))
    (loss1, w1), (loss3, w3) = results
    assert loss3 == pytest.approx(loss1, abs=1e-5)
    assert max(np.max(np.abs(a - b)) for a, b in zip(w1, w3)) < 1e-5
    assert max(np.max(np.abs(a - b)) for a, b in zip(w1, start)) > 1e-4


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training(policy):
    set_precision(policy)
    model = TrainingModel(micro_model())
    model.compile(optimizer=kt.paper_optimizer(64, 10), loss=kt.LabelSmoothedCrossEntropy())
    rng = np.random.default_rng(2)
    src = rng.integers(4, 50, size=(4, 8)).astype("int32")
    tgt = rng.integers(4, 50, size=(4, 6)).astype("int32")
    src[3] = 0  # a fully padded source row
    history = model.fit(
        tf.data.Dataset.from_tensors(((src, tgt), tgt)).repeat(4), epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
    assert all(w.dtype == "float32" for w in model.transformer.weights)
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert scaled == (policy == "mixed_float16")
    steps = int(model.optimizer.iterations.numpy())
    assert int(model.data_position.numpy()) == 4
    if scaled:
        # every skipped (non-finite) step halves the scale; 4 finite steps leave it at 2^15
        # (it doubles only after 2000 finite steps in a row)
        skipped = 4 - steps
        assert float(model.optimizer.dynamic_scale.numpy()) == 2.0**15 / 2**skipped
        assert steps >= 1
    else:
        assert steps == 4


def test_float16_overflow_on_one_replica_skips_the_step_everywhere(scripts):
    result = run_script(scripts, test_float16_overflow_on_one_replica_skips_the_step_everywhere)
    assert result["replicas"] == 2
    # step 1 (finite everywhere) is applied; step 2 overflows on replica 1 only: skipped
    assert result["iterations"] == [1, 1]
    assert result["data_position"] == 2
    assert result["loss_scale"] == [2.0**14, 2.0**14]  # halved on both replicas
    assert result["changed_by_step_1"] > 0  # the finite step really moved the weights
    assert result["changed_by_step_2"] == 0.0  # every replica's copy is unchanged...
    assert result["finite"]  # ...and finite
    assert result["replicas_agree"]


def test_bad_strategy_settings():
    with pytest.raises(StrategyError, match="unknown --strategy"):
        make_strategy("ring")
    with pytest.raises(StrategyError, match="unknown --precision"):
        set_precision("float8")
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    os.environ.pop("TF_CONFIG", None)
    with pytest.raises(StrategyError, match="TF_CONFIG"):
        make_strategy("multi_worker")
    os.environ.update(env)


def test_every_replica_draws_its_own_dropout_masks_reproducibly(scripts):
    """2 logical CPUs, the same input on both replicas: in training mode the outputs differ
    (Keras' mirrored RNG state alone gave both replicas the same masks), in inference mode
    they are equal; two identical runs of fit with dropout give identical weights."""
    result = run_script(scripts, test_every_replica_draws_its_own_dropout_masks_reproducibly)
    assert result["replicas"] == 2
    assert result["training_diff"] > 1e-2
    assert result["inference_diff"] == 0.0
    assert result["rerun_diff"] == 0.0
    assert result["one_device_diff"] > 0.0  # the masks did change the training


@pytest.mark.slow
def test_xla_trains_under_mirrored_and_matches_the_run_without_xla(scripts):
    """--jit-compile on 2 logical CPUs with 2 micro-batches per replica: XLA compiles each
    replica's forward and backward pass, not the distributed step (which failed at the
    first step). Three steps of the same training (one layer: the property does not need
    two) without and with XLA: float32 agrees to 1e-5 of the update (L2 over all weights);
    mixed_bfloat16 to 10% (measured 3.6%: XLA keeps float32 inside its fusions, so its
    bfloat16 run is the closer one to float32, 1.4% against 3.6%). With dropout (other
    random bits than without XLA from the same stateless seeds), two XLA runs are identical."""
    result = run_script(scripts, test_xla_trains_under_mirrored_and_matches_the_run_without_xla)
    assert result["replicas"] == 2
    assert result["steps"] == [3, 3, 3]
    assert all(np.isfinite(result["losses"]))
    assert result["float32_xla_vs_plain"] < 1e-5
    assert result["bfloat16_xla_vs_plain"] < 0.1
    assert result["bfloat16_xla_vs_float32"] < 0.1
    assert result["dropout_xla_rerun_diff"] == 0.0


@pytest.mark.slow
def test_xla_compiles_one_program_per_bucket_over_a_pass_of_chunks(scripts):
    """--jit-compile on 2 logical CPUs, one pass of a corpus in 7 chunks (of 150 pairs): the
    modules XLA itself compiled (dumped by --xla_dump_to, counted per run) are at most one
    per bucket and device, with at most one input shape per bucket (static rows); the
    batches without static rows (the code before them) compile one per partial batch
    (measured 18 against 6). The padding rows change nothing: same steps, same loss."""
    result = run_script(scripts, test_xla_compiles_one_program_per_bucket_over_a_pass_of_chunks)
    buckets, replicas = result["buckets"], result["replicas"]
    assert result["chunks_static"] == 7 and result["steps_static"] == result["steps_unpadded"]
    assert 0 < result["compilations_static"] <= buckets * replicas
    assert len(result["shapes_static"]) <= buckets
    assert result["compilations_unpadded"] > buckets * replicas  # what static rows remove
    assert result["loss_static"] == pytest.approx(result["loss_unpadded"], abs=1e-5)
    assert result["max_weight_diff"] < 1e-3  # XLA's sums in other shapes, 14 SGD steps at 0.5


@pytest.mark.slow
def test_xla_micro_batches_keep_one_micro_batch_in_memory(scripts):
    """Peak allocator memory of one XLA step (CPU): 64 rows in 4 micro-batches peak near one
    16-row batch (measured 52 vs 50 MiB; the whole 64-row batch: 196 MiB). Whole-step XLA
    dropped the ordering of the micro-batches: 258 MiB, as the 64-row batch."""
    peaks = run_script(scripts, test_xla_micro_batches_keep_one_micro_batch_in_memory)
    one_micro_batch, accumulated, whole = peaks["16,1"], peaks["64,4"], peaks["64,1"]
    assert accumulated < 1.25 * one_micro_batch
    assert accumulated < 0.5 * whole


def test_device_flags(monkeypatch):
    """--cpu-devices splits the CPU; --gpu-memory-growth on every GPU; --deterministic: op
    determinism on, TF32 off."""
    from tensorflow.python.framework import config as tf_config

    from keras_transformer.training import strategy as strategy_module
    from keras_transformer.training.strategy import configure_devices

    grown = []
    monkeypatch.setattr(
        tf.config, "list_physical_devices", lambda kind=None: ["gpu0", "gpu1"] if kind else []
    )
    monkeypatch.setattr(
        tf.config.experimental, "set_memory_growth", lambda d, on: grown.append((d, on))
    )
    split = []
    monkeypatch.setattr(strategy_module, "split_cpu", split.append)
    configure_devices()
    assert grown == [] and split == []
    configure_devices(cpu_devices=2)  # --cpu-devices: the CPU split first
    assert split == [2]
    configure_devices(memory_growth=True)
    assert grown == [("gpu0", True), ("gpu1", True)]
    assert not tf_config.is_op_determinism_enabled()
    try:
        configure_devices(deterministic=True)
        assert tf_config.is_op_determinism_enabled()
        assert not tf.config.experimental.tensor_float_32_execution_enabled()
    finally:
        tf_config.disable_op_determinism()
        tf.config.experimental.enable_tensor_float_32_execution(True)


def test_multi_worker_collectives_ring_on_cpu_nccl_on_gpu(monkeypatch):
    from keras_transformer.training.strategy import communication_options

    implementation = tf.distribute.experimental.CommunicationImplementation
    options = communication_options()
    assert options.implementation == implementation.RING  # no GPU here
    assert options.timeout_seconds is None  # a thread per collective: the watchdog instead
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["gpu0"])
    assert communication_options().implementation == implementation.NCCL


def test_the_planned_replicas_come_from_tf_config_without_a_strategy(monkeypatch):
    """--dry-run counts a multi-worker job's replicas from TF_CONFIG (one CPU per task here)
    instead of building the strategy, which would wait for its peers."""
    from keras_transformer.training.dry_run import planned_replicas
    from keras_transformer.training.workers import chief_task

    monkeypatch.setattr(
        tf.distribute, "MultiWorkerMirroredStrategy", lambda **kw: pytest.fail("built")
    )
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker"}}))
    assert planned_replicas("multi_worker") == 3
    assert chief_task() == "chief:0"
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:2", "h:3"]}}))
    assert planned_replicas("multi_worker") == 2
    assert chief_task() == "worker:0"
    monkeypatch.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker", "index": 0}}))
    with pytest.raises(StrategyError, match='TF_CONFIG has no "cluster"'):
        planned_replicas("multi_worker")


def test_the_tfjob_manifest_gives_one_chief_that_kt_train_recognizes():
    """docs/examples/tfjob.yaml: the TF_CONFIG that Kubeflow's operator writes for each of its
    pods (cluster of every replica type, lower-cased, port tfjob-port; the pod's own task),
    parsed by kt-train's job code: one chief (the Chief pod, not worker 0), every pod in
    the cluster, every pod running --strategy multi_worker."""
    import yaml

    from keras_transformer.training.strategy import job_task

    with open(os.path.join(ROOT, "docs", "examples", "tfjob.yaml"), encoding="utf-8") as f:
        job = yaml.safe_load(f)
    name, specs = job["metadata"]["name"], job["spec"]["tfReplicaSpecs"]
    cluster = {}
    for kind, spec in specs.items():
        (container,) = spec["template"]["spec"]["containers"]
        assert "--strategy=multi_worker" in container["command"]
        (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"]
        cluster[kind.lower()] = [
            f"{name}-{kind.lower()}-{i}.default.svc:{port}" for i in range(spec["replicas"])
        ]
    tasks = [
        job_task(json.dumps({"cluster": cluster, "task": {"type": kind, "index": i}}))
        for kind, addresses in cluster.items()
        for i in range(len(addresses))
    ]
    assert len(tasks) == 3 and all(t["tasks"] == 3 for t in tasks)
    assert [(t["type"], t["index"]) for t in tasks if t["chief"]] == [("chief", 0)]
    with pytest.raises(StrategyError, match="not in its cluster"):
        job_task(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 2}}))


def test_a_strategy_other_than_multi_worker_in_a_cluster_stops_up_front(monkeypatch):
    """TF_CONFIG naming a job of several tasks with --strategy mirrored (every task would
    train alone into the same --model-dir): StrategyError naming the flag and the task
    count, before a strategy is built; one task, or multi_worker, passes."""
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief"}}))
    for name in ("default", "one_device", "mirrored", "tpu"):
        with pytest.raises(StrategyError, match=f"--strategy {name}: .* a job of 3 tasks"):
            make_strategy(name)
    check_strategy("multi_worker")
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:1"]}}))
    check_strategy("mirrored")


def test_tpu_without_a_tpu_is_one_line(monkeypatch):
    """--strategy tpu on a machine without one: StrategyError, not TensorFlow's ValueError."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(StrategyError, match="--strategy tpu: no TPU found"):
        make_strategy("tpu")
