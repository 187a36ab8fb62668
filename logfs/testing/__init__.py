"""Rigs for the tests: things the test suite runs that are not logfs.

``logfs.testing.kafka``: a real Apache Kafka (its jars resolved by set-up, a broker, Kafka's own clients and
``DumpLogSegments``). A module here may import anything in logfs; nothing in logfs imports it (only tests/ and
tools/ do: tests/layout/test_layout.py).
"""
