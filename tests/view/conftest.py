import pytest

from logfs.storage import LogConfig, ManualClock, load_log


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def make_log(tmp_path, clock):
    """make_log(**LogConfig fields) -> Log in a fresh directory; closed at teardown."""
    opened = []

    def make_log(directory=None, had_clean_shutdown=False, **config):
        log = load_log(str(directory or tmp_path / f"t-{len(opened)}"), "t", 0, LogConfig.for_tests(**config),
                       clock=clock, had_clean_shutdown=had_clean_shutdown)
        opened.append(log)
        return log

    yield make_log
    for log in opened:
        if not log.closed:
            log.close_without_flush()
