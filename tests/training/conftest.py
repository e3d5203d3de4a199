import pytest

from tests.training.trainer_runs import write_mini_multi30k


@pytest.fixture(scope="session")
def mini_multi30k_dir(tmp_path_factory, multi30k_dir):
    """A Multi30k folder of 400 training and 100 validation pairs (trainer_runs)."""
    return write_mini_multi30k(tmp_path_factory.mktemp("mini-multi30k"), multi30k_dir)
