"""Which Spark Kafka connector the set-up asks Maven for (logfs/testing/kafka_setup.py): PySpark's own version,
then the newest earlier release of the same major version that Maven Central lists; never a preview, a newer
release, or another major version."""

from logfs.testing.kafka_setup import connector_candidates

LISTED = ["3.5.4", "4.0.0", "4.1.1", "4.1.3", "4.2.0", "4.2.0-preview5", "4.3.1", "5.0.0"]


def test_own_version_first_then_the_newest_earlier_release_of_its_major():
    assert connector_candidates("4.3.0", LISTED) == ["4.3.0", "4.2.0"]
    assert connector_candidates("4.2.0", LISTED) == ["4.2.0", "4.1.3"]
    assert connector_candidates("4.0.0", LISTED) == ["4.0.0"]  # 3.5.4 is another major
    assert connector_candidates("4.3.0", []) == ["4.3.0"]  # Maven Central's list not reached
    assert connector_candidates("4.3.0.dev0", LISTED) == ["4.3.0.dev0"]  # a development build: its own only
