"""storage/names.py: every name DATA_DIR holds, built and parsed in one place."""

from __future__ import annotations

import os

import pytest

from logfs.storage import InvalidTopicError, names


@pytest.mark.parametrize("name, expected", [
    ("t-0", ("t", 0)),
    ("a.b_c-d-12", ("a.b_c-d", 12)),
    ("x" * 249 + "-2147483647", ("x" * 249, 2147483647)),
    ("...-3", ("...", 3)),
])
def test_partition_dirs_parse(name, expected):
    assert names.parse_partition_dir(name) == expected
    assert names.partition_dir_name(*expected) == name


@pytest.mark.parametrize("name", [
    "t-²", "t-١", "t-01", "t-00", "t-+1", "t- 1", "t-1 ", "t-", "-0", "t", "t-2147483648",
    "t-99999999999", "x" * 250 + "-0", "a b-0", "é-0", ".-0", "..-0", "lost+found", "t-0-delete",
    "t-0.0123456789abcdef0123456789abcdef-delete", "t-0.0123456789abcdef0123456789abcdef-future",
])
def test_anything_else_is_not_a_partition_dir(name):
    # (str.isdigit accepted "²" and int() then raised: startup crashed; "t-01" was taken as partition 1)
    assert names.parse_partition_dir(name) is None
    assert names.parse_partition_dir("t--1") == ("t-", 1)  # ("t-" is a legal topic)


def test_partition_numbers():
    assert names.parse_partition_number("0") == 0
    assert names.parse_partition_number("2147483647") == 2147483647
    for text in ("", "01", "2147483648", "²", "-1", "+1", " 1", "1_0", "0x1"):
        assert names.parse_partition_number(text) is None, text


@pytest.mark.parametrize("name", ["x" * 249, "a", "A-b_c.d", "..."])
def test_legal_topics(name):
    names.validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "a/b", "a b", "tópic", "__cluster_metadata",
                                  "__consumer_offsets"])
def test_illegal_or_reserved_topics(name):
    with pytest.raises(InvalidTopicError):
        names.validate_topic_name(name)


def test_collision_key_is_kafkas():
    assert names.collision_key("a.b") == names.collision_key("a_b") == "a_b"
    assert names.collision_key("a-b") != names.collision_key("a_b")


@pytest.mark.parametrize("length", [1, 50, 203, 204, 213, 214, 240, 249])
@pytest.mark.parametrize("partition", [0, 7, 2147483647])
def test_delete_dir_names_fit_255_bytes(length, partition):
    topic = "t" * length
    name = names.delete_dir_name(topic, partition)
    assert len(name.encode()) <= 255
    assert names.is_delete_dir(name)
    assert name.endswith(f"-{partition}.{name.split('.')[-1]}")
    prefix = name[: name.rindex(f"-{partition}.")]
    assert topic.startswith(prefix) and (prefix == topic or len(name) == 255)


def test_delete_dir_pattern_is_exactly_logfs_own():
    unique = "0123456789abcdef0123456789abcdef"
    assert names.is_delete_dir(f"t-0.{unique}-delete")
    for other in ("x-0-delete", "t-delete", f"t-0.{unique}-delete.bak", f"t-0.{unique.upper()}-delete",
                  f"t-01.{unique}-delete", f"t-0.{unique[:-1]}-delete", f"t-0-{unique}-delete",
                  f"a b-0.{unique}-delete"):
        assert not names.is_delete_dir(other), other


def test_segment_file_names():
    assert names.segment_file_name(42, names.LOG_SUFFIX) == "00000000000000000042.log"
    assert names.parse_segment_file("00000000000000000042.timeindex.swap") == (42, ".timeindex", ".swap")
    assert names.parse_segment_file("00000000000000000042.viewindex") == (42, ".viewindex", "")
    for other in ("42.log", "0000000000000000004².log", "00000000000000000042.snapshot",
                  "00000000000000000042.log.tmp", "leader-epoch-checkpoint"):
        assert names.parse_segment_file(other) is None, other
    assert names.offset_from_file_name("42.log") == 42
    assert names.offset_from_file_name("²2.log") is None
    assert names.companion_file_name("00000000000000000042.index", names.LOG_SUFFIX) == "00000000000000000042.log"


def test_data_dir_scan_classifies_every_entry(tmp_path):
    for d in ("t-0", "t-1", "t-01", "t-²", "lost+found", "x-0-delete", "__cluster_metadata-0",
              "t-0.0123456789abcdef0123456789abcdef-delete"):
        (tmp_path / d).mkdir()
    for f in ("stray.txt", "u-0", names.RECOVERY_POINT, names.TOPICS_FILE + names.TMP_SUFFIX, names.LOCK_FILE,
              "meta.properties", "bootstrap.checkpoint", "replication-offset-checkpoint"):
        (tmp_path / f).write_text("")
    os.symlink(tmp_path / "t-0", tmp_path / "v-0")
    os.symlink(tmp_path / "stray.txt", tmp_path / "meta.properties.bak")
    scan = names.DataDirScan(str(tmp_path))
    assert [tp for tp, _ in scan.partitions] == [("t", 0), ("t", 1)]
    assert [os.path.basename(p) for p in scan.delete_dirs] == ["t-0.0123456789abcdef0123456789abcdef-delete"]
    assert scan.internal == ["__cluster_metadata-0"]
    # A broker's own files (its log directory mounts): known, left alone, not strays.
    assert scan.kafka_files == ["bootstrap.checkpoint", "meta.properties", "replication-offset-checkpoint"]
    assert sorted(scan.ignored) == sorted(["t-01", "t-²", "lost+found", "x-0-delete", "stray.txt", "u-0", "v-0",
                                           "meta.properties.bak"])
