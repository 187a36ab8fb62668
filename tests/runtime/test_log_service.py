"""The background LogService's schedules with injected time: each test moves a ManualClock and runs one
housekeeping pass (the loop's only job is to call it every tick), so rolls, retention, flushes, checkpoints,
purges and the cleaner are checked against their timers in milliseconds of real time."""

import os

import pytest
import trio
import trio.testing

from logfs.storage.checkpoints import read_checkpoint
from logfs.service.runtime import LogService


@pytest.fixture
def setup(open_manager, clock):
    """setup(**broker props, dots as underscores) -> (manager with topic ``t``, its log 0, the clock, a
    LogService), over the shared engine factory."""

    def setup(**props):
        settings = {"log.flush.offset.checkpoint.interval.ms": "1000", "log.retention.check.interval.ms": "1000"}
        settings.update({k.replace("_", "."): str(v) for k, v in props.items()})
        m = open_manager(settings)
        m.create_topic("t")
        return m, m.get_log("t", 0), clock, LogService(m)

    return setup


def append_records(log, count: int) -> None:
    """``count`` records ``record-NNN``, one append each."""
    for i in range(count):
        log.append([b"record-%03d" % i])


async def advance(service, clock, seconds, step_ms=250):
    """Move time forward in ticks, running housekeeping at each, as the service loop does."""
    for _ in range(int(seconds * 1000 // step_ms)):
        clock.advance(step_ms)
        await service.housekeeping()


async def test_idle_active_segment_rolls_on_segment_ms_and_is_flushed(setup):
    m, log, clock, service = setup(log_roll_ms=60_000)
    log.append([b"a", b"b"])
    await advance(service, clock, 30)
    assert len(log.segments) == 1  # not yet
    await advance(service, clock, 31)
    assert len(log.segments) == 2 and log.active_segment.base_offset == 2
    await advance(service, clock, 1)
    assert log.recovery_point >= 2  # the rolled segment was flushed in a worker thread
    m.close()


async def test_retention_ms_deletes_and_checkpoints_then_purges(setup):
    m, log, clock, service = setup(log_segment_bytes=300, log_retention_ms=10_000,
                                   log_segment_delete_delay_ms=5_000)
    append_records(log, 40)
    assert len(log.segments) > 3
    await advance(service, clock, 5)
    assert log.log_start_offset == 0
    await advance(service, clock, 7)  # now older than retention.ms: every sealed segment goes
    assert len(log.segments) == 1 and log.log_start_offset == log.active_segment.base_offset
    assert [n for n in os.listdir(log.directory) if n.endswith(".deleted")]  # renamed, not yet unlinked
    assert read_checkpoint(os.path.join(m.data_dir, "log-start-offset-checkpoint"))[("t", 0)] == log.log_start_offset
    await advance(service, clock, 6)
    assert not [n for n in os.listdir(log.directory) if n.endswith(".deleted")]
    m.close()


async def test_flush_ms_advances_the_recovery_point(setup):
    m, log, clock, service = setup(log_flush_interval_ms=3_000)
    log.append([b"x"] * 10)
    await advance(service, clock, 1)
    assert log.recovery_point == 0
    await advance(service, clock, 3)
    assert log.recovery_point == 10
    assert read_checkpoint(os.path.join(m.data_dir, "recovery-point-offset-checkpoint"))[("t", 0)] == 10
    m.close()


async def test_topic_override_applies_to_the_next_run(setup):
    m, log, clock, service = setup(log_segment_bytes=300)
    append_records(log, 40)
    await advance(service, clock, 3)
    assert log.log_start_offset == 0  # default retention: a week
    m.set_topic_config("t", "retention.bytes", "600")
    await advance(service, clock, 2)
    # Kafka's rule: delete oldest segments while the log exceeds retention.bytes by at least their size.
    assert log.log_start_offset > 0
    assert log.size_bytes - 600 < log.segments.first.size


async def test_cleaner_compacts_a_dirty_log(setup):
    m, log, clock, service = setup(log_segment_bytes=400, log_cleanup_policy="compact")
    for i in range(100):
        log.append([b"v%d" % i], [b"k%d" % (i % 3)])
    before = log.size_bytes
    assert service.clean_once(clock.time_ms())
    assert log.size_bytes < before / 2
    assert ("t", 0) in read_checkpoint(os.path.join(m.data_dir, "cleaner-offset-checkpoint"))
    keys = [r.key for r in log.read(0, 1 << 30) if r.offset < log.active_segment.base_offset]
    assert len(keys) == len(set(keys))
    assert not service.clean_once(clock.time_ms())  # nothing dirty left: the loop backs off
    m.close()


async def test_service_loop_runs_housekeeping_every_tick(setup):
    """The loop itself, on trio's clock: it starts, ticks, and stops with its nursery."""
    m, log, clock, service = setup()
    calls = []
    original = service.housekeeping

    async def counting():
        calls.append(trio.current_time())
        await original()

    service.housekeeping = counting
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        await trio.sleep(2.2)
        nursery.cancel_scope.cancel()
    assert len(calls) >= 3  # the tick is at most 1 s
    m.close()


async def test_initial_task_delay_postpones_the_first_retention_pass(setup):
    """log.initial.task.delay.ms (as Kafka's): the first retention pass runs that long after start, then every
    log.retention.check.interval.ms. logfs's default is 0: the first pass runs at start."""
    m, log, clock, service = setup(log_segment_bytes=300, log_retention_ms=1, log_initial_task_delay_ms=20_000,
                                   log_retention_check_interval_ms=60_000)
    append_records(log, 40)
    await advance(service, clock, 19)
    assert log.log_start_offset == 0
    await advance(service, clock, 2)
    assert log.log_start_offset > 0
    m.close()


async def test_first_retention_pass_runs_at_start_by_default(setup):
    m, log, clock, service = setup(log_segment_bytes=300, log_retention_ms=1,
                                   log_retention_check_interval_ms=60_000)
    append_records(log, 40)
    clock.advance(10)
    await service.housekeeping()
    assert log.log_start_offset > 0  # at once, not a check interval later
    m.close()


async def test_log_start_offset_checkpoint_interval_is_honoured(setup):
    """log.flush.start.offset.checkpoint.interval.ms: the log-start-offset checkpoint is written at least that
    often, even when the recovery-point checkpoint interval is longer."""
    m, log, clock, service = setup(log_flush_offset_checkpoint_interval_ms=600_000,
                                   log_flush_start_offset_checkpoint_interval_ms=2_000)
    log.append([b"a", b"b", b"c"])
    path = os.path.join(m.data_dir, "log-start-offset-checkpoint")
    await advance(service, clock, 3)
    assert os.path.exists(path) and ("t", 0) in read_checkpoint(path)
    assert service._tick_ms() <= 500
    m.close()


async def test_flush_scheduler_interval_bounds_the_tick(setup):
    m, log, clock, service = setup(log_flush_scheduler_interval_ms=50)
    assert service._tick_ms() <= 50
    m.close()


def test_the_cleaner_pass_walks_the_partitions_while_others_are_created(setup):
    """The cleaner's pass (a worker thread) looks at every partition while the request thread creates new ones
    (a mount growing to 20,000 partitions): it must walk a snapshot, never the live dict ("dictionary changed size
    during iteration" ended the writer at 14,000-19,000 partitions)."""
    import sys
    import threading

    m, _, clock, service = setup(log_cleanup_policy="compact")
    failures: list[BaseException] = []
    stop = threading.Event()

    def cleaner():
        while not stop.is_set():
            try:
                service.clean_once(clock.time_ms())
            except BaseException as exc:  # noqa: BLE001
                failures.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (switch threads as often as possible: the walk meets the creations)
    t = threading.Thread(target=cleaner)
    t.start()
    try:
        for i in range(60):
            m.create_topic(f"c{i}", 50)
            if failures:
                break
    finally:
        stop.set()
        t.join(30)
        sys.setswitchinterval(interval)
    assert not failures, failures[0]
    assert len(m.logs) == 1 + 60 * 50
    m.close()
