"""Settings are parsed as Kafka parses them (Long.parseLong, Double.parseDouble, booleans, lists, after
String.trim()), stored and shown as the effective value; broker settings logfs has no mechanism for are refused."""

import pytest

from logfs.storage import BrokerConfig, InvalidConfigError, LogConfig, validate_topic_setting
from logfs.storage.format import codecs
from logfs.storage.config import BROKER_ONLY, broker_keys, parse_double, parse_long


@pytest.mark.parametrize("text,value", [
    ("100", 100), ("+100", 100), ("-1", -1), (" 100 ", 100), ("\t7\n", 7), ("007", 7),
    ("9223372036854775807", (1 << 63) - 1), ("-9223372036854775808", -(1 << 63)),
])
def test_long_as_java_parses_it(text, value):
    assert parse_long(text) == value


@pytest.mark.parametrize("text", [
    "1_000", "1e3", "0x10", "1.0", "1 0", "", " ", "+", "-", "++1", "١٢", "²", "9223372036854775808", "abc", "1L",
])
def test_long_refuses_what_java_refuses(text):
    with pytest.raises(InvalidConfigError):
        parse_long(text)


@pytest.mark.parametrize("text,value", [
    ("0.5", 0.5), ("+.5", 0.5), ("5e-1", 0.5), ("1", 1.0), ("0.5d", 0.5), ("0.5F", 0.5), ("0x1p-1", 0.5),
    (" 0.25 ", 0.25), ("Infinity", float("inf")), ("-Infinity", float("-inf")), ("1.", 1.0),
])
def test_double_as_java_parses_it(text, value):
    assert parse_double(text) == value


@pytest.mark.parametrize("text", ["1_0", "inf", "nan", "infinity", "0.5.1", "", ".", "e3", "1e", "0x1", "½"])
def test_double_refuses_what_java_refuses(text):
    with pytest.raises(InvalidConfigError):
        parse_double(text)


@pytest.mark.parametrize("name,text,shown", [
    ("retention.ms", "+100", "100"), ("retention.ms", " 100 ", "100"), ("retention.ms", "007", "7"),
    ("min.cleanable.dirty.ratio", "+.5", "0.5"), ("min.cleanable.dirty.ratio", "5e-1", "0.5"),
    ("min.cleanable.dirty.ratio", "1", "1.0"),
    ("cleanup.policy", "delete, compact", "compact,delete"), ("cleanup.policy", " compact ", "compact"),
    ("logfs.key.separator", " = ", " = "),  # a logfs text setting: taken as it is
])
def test_topic_setting_is_stored_as_its_effective_value(name, text, shown):
    assert validate_topic_setting(name, text) == shown


@pytest.mark.parametrize("name,text", [
    ("retention.ms", "1_000"), ("retention.ms", "1e3"), ("retention.ms", "-2"), ("segment.bytes", "2147483648"),
    ("min.cleanable.dirty.ratio", "NaN"), ("min.cleanable.dirty.ratio", "1_0"),
    ("cleanup.policy", "compact,,delete"), ("cleanup.policy", ""), ("cleanup.policy", "compact;delete"),
])
def test_topic_setting_refused(name, text):
    with pytest.raises(InvalidConfigError):
        validate_topic_setting(name, text)


def test_broker_defaults_are_normalised():
    broker = BrokerConfig.from_properties({"log.retention.ms": "+100", "log.cleanup.policy": "delete , compact",
                                           "log.cleaner.min.cleanable.ratio": ".25", "log.cleaner.enable": " TRUE"})
    assert broker.topic_defaults["retention.ms"] == "100"
    assert broker.topic_defaults["cleanup.policy"] == "compact,delete"
    assert broker.topic_defaults["min.cleanable.dirty.ratio"] == "0.25"
    assert broker.get("log.cleaner.enable") is True
    assert BrokerConfig.from_properties({"log.retention.hours": "+2"}).topic_defaults["retention.ms"] == "7200000"


@pytest.mark.parametrize("key,text", [
    ("log.retention.ms", "1_000"), ("log.retention.hours", "1_0"), ("log.retention.minutes", "1.5"),
    ("num.partitions", "+"), ("log.cleaner.enable", "yes"), ("log.cleaner.io.buffer.load.factor", "inf"),
    ("log.cleaner.io.max.bytes.per.second", "1_0"),
    ("compression.type", "bogus"), ("compression.zstd.level", "99"), ("compression.lz4.level", "0"),
    ("compression.gzip.level", "0"),
])
def test_broker_setting_refused_with_its_name(key, text):
    with pytest.raises(InvalidConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_properties({key: text})


@pytest.mark.parametrize("key,text", [
    ("num.recovery.threads.per.data.dir", "8"), ("log.cleaner.io.buffer.size", "1048576"),
    ("log.cleaner.io.max.bytes.per.second", "1048576"),
])
def test_broker_settings_without_a_mechanism_are_refused_as_not_supported(key, text):
    with pytest.raises(InvalidConfigError, match="not supported"):
        BrokerConfig.from_properties({key: text})


@pytest.mark.parametrize("key,text", [
    ("num.recovery.threads.per.data.dir", "1"), ("log.cleaner.io.buffer.size", "524288"),
    ("log.cleaner.io.max.bytes.per.second", "1.7976931348623157E308"),
])
def test_values_that_ask_for_what_logfs_does_are_accepted(key, text):
    BrokerConfig.from_properties({key: text})


def test_every_broker_default_parses():
    broker = BrokerConfig.from_properties({})
    assert set(broker.broker) == set(BROKER_ONLY)


def test_stored_overrides_are_normalised_or_dropped_at_load(open_manager, tmp_path, caplog):
    """An override stored by an older parser: "+100" is read back as 100; "1_000", which Kafka would refuse,
    is dropped with a warning (the topic then uses the broker default)."""
    m = open_manager()
    m.create_topic("t")
    m.close()
    (tmp_path / "data" / "logfs-topics.json").write_text(
        '{"version": 1, "topics": {"t": {"config": {"retention.ms": "+100", "segment.ms": "1_000"}}}}\n')
    m = open_manager()
    assert m.topic_overrides("t") == {"retention.ms": "100"}
    assert m.get_log("t", 0).config.segment_ms == 604800000
    assert "dropping invalid override segment.ms='1_000'" in caplog.text


# -- compression (CONTRACT section 8; Kafka 3.8's TopicConfig / ServerTopicConfigSynonyms, KIP-390) ---------------

@pytest.mark.parametrize("name,text,shown", [
    ("compression.type", "zstd", "zstd"), ("compression.type", " lz4 ", "lz4"), ("compression.type", "snappy", "snappy"),
    ("compression.type", "gzip", "gzip"), ("compression.type", "uncompressed", "uncompressed"),
    ("compression.type", "producer", "producer"),
    ("compression.zstd.level", "-131072", "-131072"), ("compression.zstd.level", "22", "22"),
    ("compression.zstd.level", "+3", "3"), ("compression.zstd.level", "0", "0"),
    ("compression.lz4.level", "1", "1"), ("compression.lz4.level", "17", "17"),
    ("compression.gzip.level", "-1", "-1"), ("compression.gzip.level", "1", "1"), ("compression.gzip.level", "9", "9"),
])
def test_compression_settings_accepted(name, text, shown):
    assert validate_topic_setting(name, text) == shown


@pytest.mark.parametrize("name,text", [
    ("compression.type", "bogus"), ("compression.type", "ZSTD"), ("compression.type", "none"),  # case matters
    ("compression.type", ""), ("compression.type", "zstd,lz4"), ("compression.type", "lz4hc"),
    ("compression.zstd.level", "23"), ("compression.zstd.level", "-131073"), ("compression.zstd.level", "3.0"),
    ("compression.zstd.level", "-0.1"), ("compression.zstd.level", "fast"),
    ("compression.lz4.level", "0"), ("compression.lz4.level", "18"), ("compression.lz4.level", "-1"),
    ("compression.gzip.level", "0"), ("compression.gzip.level", "10"), ("compression.gzip.level", "-2"),
    ("compression.gzip.level", "1_0"),
])
def test_compression_settings_refused(name, text):
    with pytest.raises(InvalidConfigError):
        validate_topic_setting(name, text)


def test_compression_defaults_resolve_to_uncompressed():
    """Kafka's default is `producer`: keep the producer's codec. Lines through the mount arrive as text, so the
    codec of what logfs writes is none."""
    config = LogConfig.build(BrokerConfig.from_properties({}).topic_defaults, {})
    assert (config.compression_type, config.compression_zstd_level, config.compression_lz4_level,
            config.compression_gzip_level) == ("producer", 3, 9, -1)
    assert (config.codec, config.codec_level) == (codecs.NONE, None)


@pytest.mark.parametrize("overrides,codec,level", [
    ({"compression.type": "zstd"}, codecs.ZSTD, 3),
    ({"compression.type": "zstd", "compression.zstd.level": "-7"}, codecs.ZSTD, -7),
    ({"compression.type": "lz4"}, codecs.LZ4, 9),
    ({"compression.type": "lz4", "compression.lz4.level": "12"}, codecs.LZ4, 12),
    ({"compression.type": "gzip"}, codecs.GZIP, -1),
    ({"compression.type": "gzip", "compression.gzip.level": "9", "compression.zstd.level": "19"}, codecs.GZIP, 9),
    ({"compression.type": "snappy"}, codecs.SNAPPY, None),
    ({"compression.type": "uncompressed", "compression.zstd.level": "19"}, codecs.NONE, None),
])
def test_log_config_resolves_codec_and_level(overrides, codec, level):
    config = LogConfig.build(BrokerConfig.from_properties({}).topic_defaults, overrides)
    assert (config.codec, config.codec_level) == (codec, level)


def test_broker_compression_settings_are_topic_defaults():
    """Kafka 3.8 names the broker settings as the topic ones (ServerTopicConfigSynonyms.sameName)."""
    broker = BrokerConfig.from_properties({"compression.type": " gzip", "compression.gzip.level": "+4",
                                           "compression.zstd.level": "19", "compression.lz4.level": "3"})
    assert broker.topic_defaults["compression.type"] == "gzip"
    assert broker.topic_defaults["compression.gzip.level"] == "4"
    config = LogConfig.build(broker.topic_defaults, {})
    assert (config.codec, config.codec_level) == (codecs.GZIP, 4)
    topic = LogConfig.build(broker.topic_defaults, {"compression.type": "zstd"})
    assert (topic.codec, topic.codec_level) == (codecs.ZSTD, 19)
    assert "log.compression.type" not in broker_keys()


@pytest.mark.parametrize("key,text", [
    ("logfs.metrics.file", "metrics.prom"), ("logfs.metrics.file", "/var/lib/node_exporter/"),
    ("logfs.metrics.interval.ms", "50"), ("logfs.metrics.interval.ms", "10s"),
])
def test_metrics_settings_refused_with_their_name(key, text):
    with pytest.raises(InvalidConfigError, match=key.replace(".", r"\.")):
        BrokerConfig.from_properties({key: text})


def test_metrics_settings():
    broker = BrokerConfig.from_properties({})
    assert (broker.get("logfs.metrics.file"), broker.get("logfs.metrics.interval.ms")) == ("", 10000)
    broker = BrokerConfig.from_properties({"logfs.metrics.file": " /run/logfs.prom ",
                                           "logfs.metrics.interval.ms": "1000"})
    assert (broker.get("logfs.metrics.file"), broker.get("logfs.metrics.interval.ms")) == ("/run/logfs.prom", 1000)
