"""The engine's exception tree.

Every error the storage engine raises derives from :class:`LogfsError`. The FUSE layer maps these classes to
errno values in exactly one place (``logfs.fuse.errors``); nothing in the engine knows about errno.
"""


class LogfsError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidConfigError(LogfsError):
    """A setting name is unknown or its value is invalid."""


class InvalidTopicError(LogfsError):
    """A topic name breaks Kafka's naming rules."""


class TopicExistsError(LogfsError):
    """The topic already exists."""


class NoSuchTopicError(LogfsError):
    """The topic or partition does not exist."""


class TopicNotEmptyError(LogfsError):
    """A topic still has partitions and cannot be deleted."""


class InvalidPartitionError(LogfsError):
    """A partition number is not the next one, or is malformed."""


class OffsetOutOfRangeError(LogfsError):
    """The requested offset is below the log start offset or past the log end offset."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(
            f"offset {offset} is out of range [{log_start_offset}, {log_end_offset}]"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class InvalidOffsetError(LogfsError):
    """An offset given to change the log (DeleteRecords beyond the log end offset, or not a number)."""


class RecordTooLargeError(LogfsError):
    """A record is larger than ``max.message.bytes`` or than a whole segment."""


class InvalidRecordError(LogfsError):
    """A record the topic refuses for what it is (a record without a key on a compacted topic)."""


class CorruptRecordError(LogfsError):
    """A batch failed its CRC or structural checks."""


class LockedError(LogfsError):
    """Another process holds the data directory's ``.lock``."""


class ShuttingDownError(LogfsError):
    """A long operation (creating a topic's partitions) was abandoned, and undone, because the daemon stops."""


class ClusterError(LogfsError):
    """What a Kafka cluster (the store of a ``kafka://`` mount, :mod:`logfs.storage.cluster`) refused or failed to
    do: a delivery that failed or was not acknowledged in time (``EIO``), an authorization refused (``EACCES``), an
    unknown topic (``ENOENT``), a topic that exists (``EEXIST``). ``errno`` is the one the caller sees."""

    def __init__(self, message: str, errno: int):
        super().__init__(message)
        self.errno = errno


class StorageIOError(LogfsError):
    """An OS-level I/O failure while reading or writing the store; ``errno`` is kept."""

    def __init__(self, message: str, errno: int):
        super().__init__(message)
        self.errno = errno


class CommitIncompleteError(StorageIOError):
    """A sink commit failed after its commit point (a disk error): it is not refused, it will be completed; the
    errno is the failure's."""


class DataLossError(LogfsError):
    """Records asked for are gone (below the log start offset: retention removed them)."""


class InvalidRequestError(LogfsError):
    """A request to the sink's commit file is malformed, or names staged data that is not what the sink stages
    (whole, CRC-valid, uncompressed v2 batches of contiguous offsets)."""


class NoSuchStagedFileError(LogfsError):
    """A staged file named by a commit does not exist (never written, or cleaned up)."""


class StagingClosedError(LogfsError):
    """A staged file was to be created for a write that was already committed or aborted (a late task attempt)."""


class PartitionBusyError(LogfsError):
    """The partition is already being moved between log directories."""


class NotSupportedError(LogfsError):
    """A request logfs understands but does not do (moving a tiered partition between log directories)."""
