"""Kafka's own performance tools for the benchmarks: ``kafka-producer-perf-test`` (``ProducerPerformance``) and
``kafka-consumer-perf-test`` (``ConsumerPerformance``), each in a JVM of its own, from Kafka's tools jar (resolved
by logfs/testing/kafka_setup.py into ``.cache/kafka/tools-jars`` on first use). Each returns the tool's own
figures: its JVM's start is not in them, nor the consumer's group join (its fetch rate)."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from logfs.testing.kafka_setup import java, perf_tools_classpath


def perf_tool(main_class: str, args: list[str], config: dict[str, str] | None = None) -> str:
    """One of Kafka's performance tools in a JVM of its own; its stdout. ``config``: client settings given in a
    properties file (``--command-config``: a secured cluster's, whose JAAS line an argument cannot carry)."""
    with tempfile.TemporaryDirectory(prefix="kafka-perf.") as tmp:
        if config:
            path = os.path.join(tmp, "client.properties")
            with open(path, "w") as f:
                f.write("".join(f"{k}={v}\n" for k, v in config.items()))
            args = [*args, "--command-config", path]
        done = subprocess.run([java(), "-Xmx512m", "-cp", perf_tools_classpath(), main_class, *args],
                              capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{main_class} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def producer_perf(bootstrap: str, topic: str, records: int, record_size: int = 100, *props: str,
                  config: dict[str, str] | None = None) -> dict:
    """``records`` records of ``record_size`` bytes as fast as the producer goes, with ``props`` (e.g.
    ``acks=all``, ``enable.idempotence=true``); the tool's summary: records/s and MiB/s."""
    out = perf_tool("org.apache.kafka.tools.ProducerPerformance", [
        "--topic", topic, "--num-records", str(records), "--record-size", str(record_size), "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", *props], config)
    # the last line: "N records sent, X records/sec (Y MB/sec), ... ms avg latency, ..."
    found = re.findall(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\)", out)
    if not found:
        raise RuntimeError(f"ProducerPerformance printed no summary: {out[-2000:]}")
    sent, per_s, mib_s = found[-1]
    if int(sent) != records:
        raise RuntimeError(f"ProducerPerformance sent {sent} of {records} records")
    return {"records": records, "records_s": float(per_s), "mib_s": float(mib_s)}


def consumer_perf(bootstrap: str, topic: str, records: int, group: str, config: dict[str, str] | None = None) -> dict:
    """The topic's first ``records`` records read by a consumer of ``group``: the tool's figures (MB = MiB, of
    record values), its fetch rate apart from its rate with the group join."""
    out = perf_tool("org.apache.kafka.tools.ConsumerPerformance", [
        "--bootstrap-server", bootstrap, "--topic", topic, "--messages", str(records), "--timeout", "120000",
        "--group", group, "--hide-header"], config)
    row = [x.strip() for x in out.strip().splitlines()[-1].split(",")]
    # start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms,
    # fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
    if int(row[4]) < records:
        raise RuntimeError(f"ConsumerPerformance read {row[4]} of {records} records")
    return {"mib": float(row[2]), "mib_s": float(row[3]), "records": int(row[4]), "fetch_mib_s": float(row[8]),
            "fetch_s": float(row[7]) / 1000, "fetch_records_s": float(row[9])}
