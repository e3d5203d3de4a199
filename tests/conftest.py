import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Paths from the environment, resolved once against the directory pytest started in, so that
# subprocesses and notebook kernels (which run elsewhere, e.g. in a tmp dir) see the same folder.
PATH_VARIABLES = ("KT_DATA_DIR", "KT_MODEL_DIR", "XDG_CACHE_HOME")
for _name in PATH_VARIABLES:
    if os.environ.get(_name):
        os.environ[_name] = os.path.abspath(os.environ[_name])


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a few seconds (still runs in CI)")
    config.addinivalue_line(
        "markers",
        "cluster: multi-process cases (local worker jobs, kills, preemptions); CI runs them "
        "as a second step (-m cluster)",
    )


CLUSTER_FILES = (
    "tests/cluster/",
    "tests/training/test_cluster.py",
    "tests/training/test_preemption.py",
    "tests/training/test_trainer_kill.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test of the cluster files (multi-process cases: several workers, or a run killed or
    preempted and started again) is a `cluster` test (deselected by default, see
    pyproject.toml; .ci/run runs them after the README's command with `-m cluster`)."""
    for item in items:
        if item.nodeid.startswith(CLUSTER_FILES):
            item.add_marker(pytest.mark.cluster)


def pytest_sessionfinish(session, exitstatus):
    """A run that collected nothing fails loudly (exit code 5; .ci/run fails on any non-zero)."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        print("\nERROR: pytest collected no tests (exit code 5): check the paths and -k/-m filters")


# Seeded once: tf.random.set_seed clears TensorFlow's kernel cache, which destroys the
# SentencePiece resources of tokenizers already built (module-scoped fixtures).
keras.utils.set_random_seed(0)


@pytest.fixture(autouse=True)
def _reset_policy():
    """Every test starts and ends under float32."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def multi30k_dir():
    """The Multi30k files (absolute path): $KT_DATA_DIR, or its multi30k/ folder.

    The tests never download: without KT_DATA_DIR every test that needs the data fails with
    one message saying what to set (CI sets it in .ci/run).
    """
    data_dir = os.environ.get("KT_DATA_DIR")
    if not data_dir:
        pytest.fail(
            "KT_DATA_DIR is not set: point it at the directory holding multi30k/ "
            "(train.en.gz, val.de.gz, ...); the tests never download the data"
        )
    path = os.path.abspath(data_dir)
    path = path if os.path.basename(path) == "multi30k" else os.path.join(path, "multi30k")
    if not os.path.exists(os.path.join(path, "train.en.gz")):
        pytest.fail(f"Multi30k not found in {path}: point KT_DATA_DIR at the folder holding it")
    return path


__all__ = ["tf"]
