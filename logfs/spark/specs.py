"""The values of the Spark source's options, parsed: booleans, limits, offsets and timestamps (Kafka's spellings).

Offsets and timestamps are given as Spark's Kafka source takes them: ``earliest``/``latest``, or JSON per
partition (``{"topic":{"0":23,"1":-2}}``), where -2 means earliest and -1 latest. Every refusal is an
:class:`OptionError` naming the option.
"""

from __future__ import annotations

import json
from typing import Mapping

from .segments import TopicPartition

EARLIEST = -2
LATEST = -1


class OptionError(ValueError):
    """An invalid or missing option of the logfs source."""


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return value == "true"


def positive_int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {raw!r}") from None
    if value < 0:
        raise OptionError(f"option {name} must not be negative, not {raw!r}")
    return value or None  # 0 switches the limit off


def _per_partition(data: dict, name: str, noun: str, meaning: str) -> dict[TopicPartition, int]:
    """A JSON object ``{topic: {partition: value}}`` as a map; each value an int >= -2 (``noun`` in the refusal,
    with ``meaning``)."""
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {name}: topic {topic!r} must map partitions to {noun}s")
        for part, value in parts.items():
            try:
                partition = int(part)
            except ValueError:
                raise OptionError(f"option {name}: {part!r} of topic {topic!r} is not a partition") from None
            if not isinstance(value, int) or isinstance(value, bool) or value < -2:
                raise OptionError(f"option {name}: {noun} {value!r} of {topic}-{part} is not {meaning}")
            out[TopicPartition(topic, partition)] = value
    return out


def offsets_spec(raw: str | None, name: str) -> int | dict[TopicPartition, int] | None:
    """``earliest`` -> EARLIEST, ``latest`` -> LATEST, Kafka's JSON ``{"topic":{"0":23,"1":-2}}`` -> a map
    (-2 earliest, -1 latest), None when unset."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lower() == "earliest":
        return EARLIEST
    if text.lower() == "latest":
        return LATEST
    try:
        data = json.loads(text)
    except ValueError:
        raise OptionError(f"option {name} must be earliest, latest or JSON like "
                          f"{{\"topic\":{{\"0\":23}}}}, not {text!r}") from None
    if not isinstance(data, dict):
        raise OptionError(f"option {name}: expected a JSON object of topics, not {text!r}")
    return _per_partition(data, name, "offset", "an offset (-2 earliest, -1 latest, or >= 0)")


def timestamp_option(raw: str | None, name: str) -> int | None:
    """A global timestamp option (epoch ms; -2 earliest, -1 latest, as Kafka's ListOffsets takes them)."""
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be a timestamp in milliseconds since the epoch, not {raw!r}") \
            from None
    if value < -2:
        raise OptionError(f"option {name}: {value} is not a timestamp (-2 earliest, -1 latest, or >= 0)")
    return value


def timestamps_spec(raw: str | None, name: str) -> dict[TopicPartition, int] | None:
    """``{"topic":{"0":1700000000000,"1":-1}}`` -> a map (epoch ms; -2 earliest, -1 latest), None when unset."""
    if raw is None:
        return None
    text = str(raw).strip()
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise OptionError(f"option {name} must be JSON like {{\"topic\":{{\"0\":1700000000000}}}}, not {text!r}")
    return _per_partition(data, name, "timestamp",
                          "a timestamp (-2 earliest, -1 latest, or milliseconds since the epoch)")
