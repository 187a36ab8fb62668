"""tools/spark_pipeline.py end to end on a real mount: events appended through the mount, aggregated by Spark
(reading the mount as files, then the logfs data source), totals written with the logfs sink (each user once),
checked through the mount."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

pytestmark = pytest.mark.mount

TOOL = Path(__file__).resolve().parents[2] / "tools" / "spark_pipeline.py"


@pytest.fixture(scope="module")
def pipeline():
    spec = importlib.util.spec_from_file_location("spark_pipeline", TOOL)
    module = importlib.util.module_from_spec(spec)
    import sys

    sys.modules["spark_pipeline"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("spark_pipeline", None)


def test_pipeline_over_the_mount_and_the_logfs_source(spark, mount_logfs, pipeline):
    fs = mount_logfs("num.partitions=3", "log.segment.bytes=32768")
    mnt = str(fs.mnt)
    events = pipeline.produce_events(mnt, 3000, users=25)
    assert len(events) == 3000

    users = pipeline.run_job(spark, mnt)
    assert users == 25
    totals = pipeline.check(mnt, events)
    assert sum(t["events"] for t in totals.values()) == 3000
    # The totals are keyed records: the key is the user (logfs.key.separator of the topic), one per user.
    assert fs.getx("user_totals", "config.logfs.key.separator") == "\t"
    lines = [line for _, line in pipeline.read_topic_lines(mnt, "user_totals")]
    assert len(lines) == 25 and all(json.loads(l.split("\t", 1)[1])["user"] == l.split("\t", 1)[0] for l in lines)

    # The same job reading DATA_DIR's segments with the logfs data source instead of the mount's files.
    assert pipeline.run_job(spark, mnt, totals_topic="user_totals_2", source="logfs", data_dir=str(fs.data)) == 25
    assert pipeline.check(mnt, events, totals_topic="user_totals_2") == totals
    assert sorted(os.listdir(fs.mnt)) == ["events", "user_totals", "user_totals_2"]
