import pytest

from logfs.storage import LogConfig, ManualClock, load_log


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def open_log(tmp_path, clock):
    """open_log(config=None, directory=None, **load_log kwargs) -> Log; every log is closed at teardown."""
    opened = []

    def open_log(config=None, directory=None, **kw):
        directory = str(directory or tmp_path / "t-0")
        log = load_log(directory, "t", 0, config or LogConfig.for_tests(), clock=kw.pop("clock", clock), **kw)
        opened.append(log)
        return log

    yield open_log
    for log in opened:
        if not log.closed:
            log.close_without_flush()

