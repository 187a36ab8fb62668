"""The rig: what the tests and the benchmarks start that is not logfs, as trio has ``trio.testing``.

``mounts`` (the one "is it mounted" check, the one logfs command line and unmount, the daemon finder),
``seaweed`` (a real S3 server, SeaweedFS, and TCP proxies that stall or throttle it), ``spark_standalone`` (a Spark
standalone cluster, and ``cluster_driver``, its driver process), ``kafka`` (a real Apache Kafka: ``kafka_setup``
resolves its jars, ``kafka_dump`` parses its DumpLogSegments), ``faultfs`` (a FUSE passthrough that fails chosen
calls and models a power cut; ``faultfs_rules``, ``faultfs_client`` drives it), ``nullfs`` (the do-nothing FUSE
filesystem, the benchmarks' ceiling), ``unit_sandbox`` (a systemd unit's restrictions without systemd) and
``benchlib`` (what the bench scripts share). The ones that are processes of their own run as
``python -m logfs.testing.<name>``.

A module here may import anything in logfs; nothing in logfs imports it (only tests/ and tools/ do:
tests/layout/test_layout.py).
"""
