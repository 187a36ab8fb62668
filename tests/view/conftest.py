import pytest


@pytest.fixture
def make_log(tmp_path, open_log):
    """make_log(directory=None, had_clean_shutdown=False, **LogConfig fields) -> Log in a fresh directory (the
    shared ``open_log`` factory of tests/conftest.py, one directory per call)."""
    made = []

    def make_log(directory=None, had_clean_shutdown=False, **config):
        made.append(None)
        return open_log(None, directory or tmp_path / f"t-{len(made) - 1}", had_clean_shutdown=had_clean_shutdown,
                        **config)

    return make_log
