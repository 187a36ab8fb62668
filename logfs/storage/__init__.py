"""The logfs storage engine: Kafka-compatible partition logs, synchronous and free of FUSE and trio.

Layers, bottom up: records (v2 batch codec) -> index (offset, time, view indexes) -> segment (one .log and
its indexes) -> segment_set (a log's segments; snapshots pin them) -> log (one partition) -> loader (recovery)
-> manager (all partitions of a data directory). lifecycle creates segments and swaps them; reader reads a
data directory read-only, for other processes.
"""

from .clock import SYSTEM_CLOCK, Clock, ManualClock
from .config import BrokerConfig, LogConfig, TOPIC_SETTINGS, validate_topic_setting
from .errors import (
    CorruptRecordError, InvalidConfigError, InvalidPartitionError, InvalidRecordError, InvalidTopicError, LockedError,
    DataLossError, LogfsError, NoSuchTopicError, OffsetOutOfRangeError, RecordTooLargeError,
    StorageIOError, TopicExistsError, TopicNotEmptyError,
)
from .format.lines import LineStats
from .local.loader import load_log
from .local.log import Log
from .manager import LogManager
from .names import validate_topic_name
from .format.records import Record, build_batch
from .local.segments import LogSnapshot

__all__ = [
    "SYSTEM_CLOCK", "Clock", "ManualClock", "BrokerConfig", "LogConfig", "TOPIC_SETTINGS",
    "validate_topic_setting", "CorruptRecordError", "DataLossError", "InvalidConfigError", "InvalidPartitionError",
    "InvalidRecordError", "InvalidTopicError", "LockedError", "LogfsError", "NoSuchTopicError",
    "OffsetOutOfRangeError", "RecordTooLargeError", "StorageIOError", "TopicExistsError",
    "TopicNotEmptyError", "LineStats", "load_log", "Log", "LogSnapshot", "LogManager",
    "validate_topic_name", "Record", "build_batch",
]
