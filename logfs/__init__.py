"""logfs: a Kafka-style commit log you use as a filesystem."""

__version__ = "0.1.0"
