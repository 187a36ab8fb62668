"""A real Apache Kafka for the tests (CONTRACT.md section 13): its jars, a broker, its own clients.

Set-up (``tools/dev.sh`` runs ``python -m logfs.testing.kafka setup``) puts Kafka's jars in ``.cache/kafka``
(:mod:`logfs.testing.kafka_setup`: where they are, the Spark connector's status).

- :class:`KafkaBroker`: one KRaft node, broker and controller in one JVM, on 127.0.0.1 with free ports; formats its
  directories on first start, ``start``/``stop`` (SIGTERM, Kafka's clean shutdown)/``kill``, started again on the
  same directories and ports. Node ids and the formatting arguments are its own, so three of them with
  ``--initial-controllers`` can make a cluster later.
- :class:`SaslUsers`: a broker that authenticates its clients (SASL_PLAINTEXT, PLAIN; SCRAM-SHA-256 and -512 too
  with ``scram=True``: the users' credentials are written by the storage format's ``--add-scram``) and authorizes
  them by ACLs (KRaft's ``StandardAuthorizer``, nothing allowed where no ACL says so); its first user is a super user
  (the controller and inter-broker listeners log in as it, and so does a test's admin client). With ``tls``
  (:class:`TlsFiles`: a CA, the broker's certificate and client certificates made with the ``openssl`` CLI at test
  time) the broker also listens with SSL (a client certificate required; ``CN=<user>`` is that user) and SASL_SSL,
  each on a port of its own (:meth:`KafkaBroker.bootstrap_for`).
- :class:`KafkaClient`: Kafka's Java clients (producer, consumer, admin) and ``kafka.tools.DumpLogSegments`` in one
  JVM that lives as long as the object, answering one JSON command a line (``kafka_jvm/KafkaClient.java``).
- :mod:`logfs.testing.kafka_dump`: DumpLogSegments over many files in one call, its output parsed.

Every process started here is ended by ``stop``/``close``, and gets SIGTERM if the thread that started it dies
first (PR_SET_PDEATHSIG): start them from a thread that outlives them (the main thread, as session fixtures do).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .kafka_setup import (  # noqa: F401  (the set-up's names, for the tests and tools that use this module)
    KafkaError, KafkaNotSetUp, client_classpath, jars_dir, java, kafka_classpath, kafka_version, setup,
    spark_connector_jars, spark_connector_status,
)

STARTED_MESSAGE = "Kafka Server started"  # KafkaRaftServer's line once the node serves
LOG4J_CONFIG = Path(__file__).resolve().parent / "kafka_jvm" / "log4j2.properties"


# -- processes ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _jvm(heap: str, log_file: Path, level: str) -> list[str]:
    return [java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            f"-Dlogfs.log.file={log_file}", f"-Dlogfs.log.level={level}"]


def random_uuid() -> str:
    """A Kafka Uuid as ``kafka-storage.sh random-uuid`` prints it (base64url of 16 bytes, no padding, never
    starting with '-')."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@dataclass
class ConsumedRecord:
    """A record as Kafka's consumer returns it."""
    offset: int
    timestamp: int
    timestamp_type: str  # CreateTime, LogAppendTime
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    leader_epoch: int | None = None


def _consumed(r: dict) -> ConsumedRecord:
    return ConsumedRecord(r["offset"], r["timestamp"], r["timestamp_type"], _unb64(r["key"]), _unb64(r["value"]),
                          [(k, _unb64(v)) for k, v in r["headers"]], r.get("leader_epoch"))


class KafkaClient:
    """Kafka's Java clients and DumpLogSegments in one JVM, started by :meth:`start`, ended by :meth:`close`."""

    def __init__(self, workdir: str | Path, heap: str = "384m"):
        self.workdir = Path(workdir)
        self.heap = heap
        self.proc: subprocess.Popen | None = None
        self._lines: queue.Queue = queue.Queue()
        self._lock = threading.Lock()

    def start(self) -> "KafkaClient":
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [*_jvm(self.heap, self.workdir / "client.log", "WARN"), "-cp", client_classpath(), "KafkaClient"]
        self._stderr = open(self.workdir / "client.err", "ab")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     preexec_fn=_die_with_parent)
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True, name="kafka-client").start()
        self.call({"cmd": "ping"}, timeout=60)
        return self

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def call(self, command: dict, timeout: float = 120) -> dict:
        """Send one command, return its reply; :class:`KafkaError` with Java's stack trace when it failed."""
        if self.proc is None or self.proc.poll() is not None:
            raise KafkaError(f"the client JVM is not running (see {self.workdir / 'client.err'})")
        with self._lock:
            self.proc.stdin.write(json.dumps(command).encode() + b"\n")
            self.proc.stdin.flush()
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                self.close(force=True)
                raise KafkaError(f"no reply to {command.get('cmd')} in {timeout} s: the client JVM was killed")
        if line is None:
            raise KafkaError(f"the client JVM died (see {self.workdir / 'client.err'})")
        reply = json.loads(line)
        if not reply.pop("ok"):
            raise KafkaError(f"{command.get('cmd')} failed in Kafka's client:\n{reply['error']}")
        return reply

    def close(self, force: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if not force:
            try:
                proc.stdin.close()  # end of commands: the JVM closes its admin clients and exits
                proc.wait(timeout=15)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._stderr.close()

    # -- commands -------------------------------------------------------------------------------------------
    def create_topics(self, bootstrap: str, topics: list[dict]) -> dict[str, str]:
        """``topics``: {"name", "partitions", "replication_factor", "configs"}; returns name -> topic id."""
        return self.call({"cmd": "create_topics", "bootstrap": bootstrap, "topics": topics})["topic_ids"]

    def produce(self, bootstrap: str, records: list[dict], producers: dict[str, dict] | None = None,
                session: str | None = None, end_session: bool = False, **props: str) -> list[dict]:
        """``records``: {"topic", "partition", "key", "value" (bytes or None), "headers": [(name, bytes|None)],
        "timestamp"}, or {"txn": "begin"|"commit"|"abort"} (with a ``transactional_id`` prop). Props are producer
        settings with '_' for '.' (``enable_idempotence="true"``, ``compression_type="zstd"``). Returns
        {"partition", "offset", "timestamp"} per record, in order.

        Several producers taking turns: ``producers`` names them, each with its settings over ``props`` (same
        spelling), and an entry's ``"producer": name`` picks one (none: the producer of ``props``). A producer is
        flushed when the next entry names another, so the log holds their records in the order given (a
        transaction's records among another producer's).

        With ``session`` the producers outlive the call (a later call of that session uses them: a transaction
        begun in one call stays open, its records in the log, until a later call commits or aborts it);
        ``end_session`` closes them after the call."""
        wire = []
        for r in records:
            if "txn" in r:
                wire.append({"txn": r["txn"]})
            else:
                wire.append({"topic": r["topic"], "partition": r.get("partition"), "timestamp": r.get("timestamp"),
                             "key": _b64(r.get("key")), "value": _b64(r.get("value")),
                             "headers": [[k, _b64(v)] for k, v in r.get("headers", ())]})
            if r.get("producer"):
                wire[-1]["producer"] = r["producer"]
        settings = {k.replace("_", "."): str(v) for k, v in props.items()}
        command = {"cmd": "produce", "bootstrap": bootstrap, "props": settings, "records": wire}
        if session:
            command.update(session=session, end_session=end_session)
        if producers:
            own = {name: {k.replace("_", "."): str(v) for k, v in given.items()} for name, given in producers.items()}
            command["producers"] = own
        return self.call(command)["sent"]

    def consume(self, bootstrap: str, topic: str, partition: int = 0, offset: int | None = None,
                isolation: str = "read_committed", timeout_ms: int = 30000, leader_epoch: int | None = None,
                **props: str) -> list[ConsumedRecord]:
        """Every record from ``offset`` (the log start when None) to the end the isolation level sees. With
        ``leader_epoch`` the consumer starts as from a committed offset with that epoch: it validates the position
        with OffsetsForLeaderEpoch first. Props are consumer settings with '_' for '.'
        (``auto_offset_reset="none"``: a truncation the validation finds is an error, not a reset)."""
        settings = {k.replace("_", "."): str(v) for k, v in props.items()}
        reply = self.call({"cmd": "consume", "bootstrap": bootstrap, "topic": topic, "partition": partition,
                           "offset": offset, "isolation": isolation, "timeout_ms": timeout_ms,
                           "leader_epoch": leader_epoch, "props": settings},
                          timeout=timeout_ms / 1000 + 30)
        return [ConsumedRecord(r["offset"], r["timestamp"], r["timestamp_type"], _unb64(r["key"]),
                               _unb64(r["value"]), [(k, _unb64(v)) for k, v in r["headers"]],
                               r.get("leader_epoch")) for r in reply["records"]]

    def list_offsets(self, bootstrap: str, topic: str, partition: int = 0, timestamps=(),
                     isolation: str = "read_committed") -> dict:
        """Kafka's ListOffsets: {"earliest", "latest", "max_timestamp": {"offset", "timestamp"},
        "by_timestamp": [{"offset", "timestamp"} or None per timestamp]}."""
        return self.call({"cmd": "list_offsets", "bootstrap": bootstrap, "topic": topic, "partition": partition,
                          "timestamps": list(timestamps), "isolation": isolation})

    def consume_partitions(self, bootstrap: str, partitions: list[tuple[str, int]],
                           isolation: str = "read_committed",
                           timeout_ms: int = 60000) -> dict[tuple[str, int], list[ConsumedRecord]]:
        """:meth:`consume` of many partitions by one consumer (one consumer's start-up, not one per partition):
        (topic, partition) -> every record from its log start to the end the isolation level sees."""
        reply = self.call({"cmd": "consume_partitions", "bootstrap": bootstrap,
                           "partitions": [list(tp) for tp in partitions], "isolation": isolation,
                           "timeout_ms": timeout_ms}, timeout=timeout_ms / 1000 + 30)
        return {(p["topic"], p["partition"]): [_consumed(r) for r in p["records"]] for p in reply["by_partition"]}

    def commit_offsets(self, bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit ``offsets`` ((topic, partition) -> offset) for consumer group ``group`` (Kafka's admin
        AlterConsumerGroupOffsets: records in ``__consumer_offsets``; the group must have no active member)."""
        self.call({"cmd": "commit_offsets", "bootstrap": bootstrap, "group": group,
                   "offsets": [[t, p, o] for (t, p), o in offsets.items()]})

    def alter_log_dirs(self, bootstrap: str, moves: dict[tuple[str, int, int], str]) -> None:
        """Move replicas between a broker's log directories ((topic, partition, broker id) -> the directory):
        Kafka's admin AlterReplicaLogDirs (the broker copies the log into a ``-future`` directory there, then swaps
        it in)."""
        self.call({"cmd": "alter_log_dirs", "bootstrap": bootstrap,
                   "moves": [[t, p, b, str(d)] for (t, p, b), d in moves.items()]})

    def run_main(self, main_class: str, args: list[str], timeout: float = 300) -> dict:
        """A Kafka tool's main run in this JVM: {"stdout", "stderr", "status", "error" (its exception or None)}."""
        return self.call({"cmd": "run_main", "class": main_class, "args": list(args)}, timeout=timeout)

    def dump(self, args: list[str], timeout: float = 300) -> dict:
        """kafka.tools.DumpLogSegments with ``args``: {"stdout", "stderr", "status", "error"}."""
        return self.run_main("kafka.tools.DumpLogSegments", args, timeout)


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise KafkaError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


@dataclass(frozen=True)
class TlsFiles:
    """A test CA (``ca.pem``), the broker's key and certificate for 127.0.0.1 and localhost in one PEM file
    (``broker.pem``: Kafka's ``ssl.keystore.type=PEM``), and per client a certificate (``<name>.crt``, subject
    ``CN=<name>``) and its key encrypted with :attr:`key_password` (``<name>.key``), made by :meth:`make` with the
    ``openssl`` CLI (EC P-256 keys: quick to make)."""
    directory: Path
    key_password: str = "key-secret"

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        return self.directory / "broker.pem"

    def certificate(self, client: str) -> Path:
        return self.directory / f"{client}.crt"

    def key(self, client: str) -> Path:
        return self.directory / f"{client}.key"

    @classmethod
    def make(cls, directory: str | Path, clients=(), key_password: str = "key-secret") -> "TlsFiles":
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3", "-subj",
                 "/CN=logfs-test-ca", cwd=d)
        (d / "broker.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for name, subject, ext in [("broker", "/CN=localhost", ["-extfile", "broker.ext"])] + [
                (client, f"/CN={client}", []) for client in clients]:
            _openssl("req", *ec, "-keyout", f"{name}.plain.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
            _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                     "-days", "3", "-out", f"{name}.crt", *ext, cwd=d)
            if name != "broker":
                (d / f"{name}.pem").write_bytes((d / f"{name}.plain.key").read_bytes()
                                                + (d / f"{name}.crt").read_bytes())  # (Java's PEM keystore)
                _openssl("pkcs8", "-topk8", "-in", f"{name}.plain.key", "-out", f"{name}.key", "-v2", "aes-256-cbc",
                         "-passout", f"pass:{key_password}", cwd=d)
        (d / "broker.pem").write_bytes((d / "broker.plain.key").read_bytes() + (d / "broker.crt").read_bytes())
        return cls(d, key_password)

    def client_settings(self, client: str | None = None) -> dict[str, str]:
        """librdkafka's TLS settings trusting the CA (and presenting ``client``'s certificate)."""
        settings = {"ssl.ca.location": str(self.ca)}
        if client is not None:
            settings.update({"ssl.certificate.location": str(self.certificate(client)),
                             "ssl.key.location": str(self.key(client)), "ssl.key.password": self.key_password})
        return settings

    def java_client_settings(self, client: str | None = None) -> dict[str, str]:
        """Kafka's Java clients' TLS settings (PEM trust store; ``client``'s key and certificate as a PEM key store)."""
        settings = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ca)}
        if client is not None:
            settings.update({"ssl.keystore.type": "PEM",
                             "ssl.keystore.location": str(self.directory / f"{client}.pem")})
        return settings


SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class SaslUsers:
    """The users of a broker with SASL_PLAINTEXT listeners (PLAIN) and KRaft's ``StandardAuthorizer``: name ->
    password, the first one a super user (the broker's own listeners log in as it). Nothing is allowed where no ACL
    says so (``allow.everyone.if.no.acl.found=false``): a test grants its users what they may do through Kafka's
    admin API (CreateAcls) as the super user. ``scram``: the clients' SASL listeners enable SCRAM-SHA-256 and
    SCRAM-SHA-512 too (every user has credentials of both); ``tls``: SSL and SASL_SSL listeners too."""
    users: dict[str, str]
    scram: bool = False
    tls: TlsFiles | None = None

    @property
    def super_user(self) -> str:
        return next(iter(self.users))

    def jaas(self, user: str) -> str:
        """The PLAIN login module's line of a listener: its own login (``user``) and every user's password."""
        known = " ".join(f'user_{name}="{password}"' for name, password in self.users.items())
        return (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{user}" '
                f'password="{self.users[user]}" {known};')

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The clients' SASL mechanisms."""
        return ("PLAIN", *SCRAM_MECHANISMS) if self.scram else ("PLAIN",)

    def scram_args(self) -> list[str]:
        """The storage format's arguments that write every user's SCRAM credentials."""
        if not self.scram:
            return []
        return [arg for mechanism in SCRAM_MECHANISMS for name, password in self.users.items()
                for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")]

    def properties(self, port: int, controller_port: int, tls_ports: dict[str, int] | None = None) -> dict[str, str]:
        """The broker's settings; ``tls_ports``: the SSL and SASL_SSL listeners' ports (with :attr:`tls`)."""
        admin = self.super_user
        listeners = {"SASL_PLAINTEXT": port, **(tls_ports or {})}
        props = {
            "listeners": ",".join(f"{name}://127.0.0.1:{p}" for name, p in listeners.items())
            + f",CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": ",".join(f"{name}://127.0.0.1:{p}" for name, p in listeners.items()),
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "listener.security.protocol.map": ",".join(["CONTROLLER:SASL_PLAINTEXT",
                                                        *(f"{name}:{name}" for name in listeners)]),
            "sasl.enabled.mechanisms": ",".join(self.mechanisms),
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": self.jaas(admin),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{admin}",
            "allow.everyone.if.no.acl.found": "false",
        }
        for name in listeners:
            if name.startswith("SASL_"):
                props[f"listener.name.{name.lower()}.plain.sasl.jaas.config"] = self.jaas(admin)
                for mechanism in self.mechanisms[1:]:
                    props[f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config"] = (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;")
        if tls_ports:
            props.update({
                "ssl.keystore.type": "PEM", "ssl.keystore.location": str(self.tls.broker_keystore),
                "ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.tls.ca),
                "listener.name.ssl.ssl.client.auth": "required",
                "ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/,DEFAULT",  # (CN=alice is User:alice)
            })
        return props

    def client_settings(self, user: str) -> dict[str, str]:
        """librdkafka's (and Kafka's) client settings of ``user``."""
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
                "sasl.password": self.users[user]}

    def java_client_settings(self, user: str, mechanism: str = "PLAIN") -> dict[str, str]:
        """Kafka's Java clients' SASL settings of ``user`` (its JAAS line)."""
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                "sasl.jaas.config": f'{module} required username="{user}" password="{self.users[user]}";'}


class KafkaBroker:
    """One KRaft node (process.roles=broker,controller) on 127.0.0.1, its config and logs in ``directory``. With
    ``sasl`` (:class:`SaslUsers`) its listeners authenticate and authorize (its clients need the settings
    ``sasl.client_settings(user)`` gives; the session's :class:`KafkaClient` speaks PLAINTEXT only)."""

    def __init__(self, directory: str | Path, log_dirs: list[str | Path] | None = None, *, node_id: int = 1,
                 client: KafkaClient | None = None, settings: dict[str, str] | None = None, heap: str = "512m",
                 sasl: SaslUsers | None = None):
        self.directory = Path(directory)
        self.sasl = sasl
        self.log_dirs = [Path(d) for d in (log_dirs or [self.directory / "data"])]
        self.node_id = node_id
        self.client = client
        self.settings = dict(settings or {})
        self.heap = heap
        self.port = free_port()
        self.controller_port = free_port()
        # (the SSL and SASL_SSL listeners of a broker with TLS: see SaslUsers)
        self.tls_ports = {"SSL": free_port(), "SASL_SSL": free_port()} if sasl is not None and sasl.tls else {}
        self.cluster_id = random_uuid()
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, protocol: str) -> str:
        """The address of the listener of ``protocol`` (``SSL``, ``SASL_SSL``; else the first listener's)."""
        return f"127.0.0.1:{self.tls_ports.get(protocol, self.port)}"

    @property
    def log_file(self) -> Path:
        return self.directory / "server.log"

    def properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": ",".join(str(d) for d in self.log_dirs),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # One node: the internal topics with one replica, and one partition each (their default 50 cost start
            # time and files for nothing here).
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1", "share.coordinator.state.topic.min.isr": "1",
            # Fast for tests.
            "group.initial.rebalance.delay.ms": "0",
            "log.segment.delete.delay.ms": "500",
            "log.cleaner.backoff.ms": "200",
            "log.retention.check.interval.ms": "1000",
            "log.initial.task.delay.ms": "0",
            # Nothing deleted by age unless a test asks (a topic's retention.ms): tests write records stamped
            # with fixed, old times (ManualClock), which Kafka's default 7 days would delete at once.
            "log.retention.ms": "-1",
        }
        if self.sasl is not None:
            props.update(self.sasl.properties(self.port, self.controller_port, self.tls_ports))
        props.update(self.settings)
        return props

    def format_args(self) -> list[str]:
        """StorageTool's arguments that say how the quorum starts: this node alone."""
        return ["--standalone"]

    def _write_config(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        return path

    def formatted(self) -> bool:
        return all((d / "meta.properties").exists() for d in self.log_dirs)

    def format(self) -> None:
        """Kafka's StorageTool format: in the client's JVM when there is one, else in a JVM of its own."""
        config = self._write_config()
        args = ["format", "-t", self.cluster_id, "-c", str(config), *self.format_args(),
                *(self.sasl.scram_args() if self.sasl is not None else [])]
        if self.client is not None:
            r = self.client.run_main("kafka.tools.StorageTool", args, timeout=120)
            status, output = r["status"], r["stdout"] + r["stderr"] + (r["error"] or "")
        else:
            p = subprocess.run([*_jvm("256m", self.directory / "storage-tool.log", "WARN"), "-cp", kafka_classpath(),
                                "kafka.tools.StorageTool", *args], capture_output=True, text=True, timeout=120)
            status, output = p.returncode, p.stdout + p.stderr
        if status != 0 or not self.formatted():
            raise KafkaError(f"kafka-storage format failed ({status}):\n{output}")

    def start(self, timeout: float = 120) -> "KafkaBroker":
        """Format (first start only), start, and wait until the node says it serves."""
        self.launch()
        return self.wait_started(timeout)

    def launch(self) -> None:
        """Format (first start only) and start the process, without waiting: the nodes of a cluster are launched
        together (each waits for a quorum of controllers), then waited for (:meth:`wait_started`)."""
        if self.proc is not None and self.proc.poll() is None:
            raise KafkaError("the broker is already running")
        self._started = time.monotonic()
        if not self.formatted():
            self.format()
        config = self._write_config()
        self._seen = self.log_file.stat().st_size if self.log_file.exists() else 0
        with open(self.directory / "kafka.out", "ab") as out:
            self.proc = subprocess.Popen(
                [*_jvm(self.heap, self.log_file, "INFO"), "-cp", kafka_classpath(), "kafka.Kafka", str(config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def wait_started(self, timeout: float = 120) -> "KafkaBroker":
        """Wait until the node :meth:`launch` started says it serves."""
        started, seen = self._started, self._seen
        deadline = time.monotonic() + timeout
        while True:
            if self.log_file.exists():
                with open(self.log_file, "rb") as f:
                    f.seek(seen)
                    if STARTED_MESSAGE.encode() in f.read():
                        break
            if self.proc.poll() is not None:
                raise KafkaError(f"the broker exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise KafkaError(f"the broker did not start in {timeout} s:\n{self.tail()}")
            time.sleep(0.05)
        self.start_seconds = time.monotonic() - started
        return self

    def tail(self, lines: int = 40) -> str:
        out = []
        for path in (self.directory / "kafka.out", self.log_file):
            if path.exists():
                out += [f"--- {path}"] + path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(out)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60) -> int:
        """Kafka's clean shutdown (SIGTERM), waited for; killed if it takes longer than ``timeout``."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise KafkaError(f"the broker did not stop in {timeout} s: killed")
        self.proc = None
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash (no clean shutdown marker)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> str:
        """Create a topic through Kafka's admin client; returns its topic id."""
        if self.client is None:
            raise KafkaError("the broker was made without a KafkaClient")
        return self.client.create_topics(self.bootstrap, [{"name": name, "partitions": partitions,
                                                           "replication_factor": 1,
                                                           "configs": dict(configs or {})}])[name]


class ClusterNode(KafkaBroker):
    """One node (broker and controller) of a KRaft cluster of several (:func:`running_cluster`): the quorum is every
    node's controller listener, formatted with ``--initial-controllers``."""

    def __init__(self, directory, *, node_id: int, client: KafkaClient, settings: dict[str, str] | None = None):
        super().__init__(directory, node_id=node_id, client=client, settings=settings)
        self.directory_id = random_uuid()  # its metadata log directory's, named in --initial-controllers
        self.peers: list["ClusterNode"] = [self]

    def properties(self) -> dict[str, str]:
        props = super().properties()
        props["controller.quorum.bootstrap.servers"] = ",".join(
            f"127.0.0.1:{n.controller_port}" for n in self.peers)
        return props

    def format_args(self) -> list[str]:
        return ["--initial-controllers", ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}:{n.directory_id}" for n in self.peers)]


@contextlib.contextmanager
def running_cluster(directory, client: KafkaClient, nodes: int = 3, settings: dict[str, str] | None = None):
    """``nodes`` :class:`ClusterNode` s under ``directory``, launched together and waited for; every one killed on
    exit (a clean stop of the last nodes waits for a quorum that the first ones to stop took away: a minute each).
    Yields the list; ``bootstrap_of(nodes)`` names them all."""
    directory = Path(directory)
    members = [ClusterNode(directory / f"node{i}", node_id=i, client=client, settings=settings)
               for i in range(1, nodes + 1)]
    cluster_id = random_uuid()
    for n in members:
        n.peers = members
        n.cluster_id = cluster_id
    try:
        for n in members:
            n.launch()
        for n in members:
            n.wait_started(240)
        yield members
    finally:
        for n in members:
            n.kill()


def bootstrap_of(nodes: list[KafkaBroker]) -> str:
    return ",".join(n.bootstrap for n in nodes)


@contextlib.contextmanager
def running_broker(directory, client: KafkaClient, sasl: SaslUsers | None = None,
                   settings: dict[str, str] | None = None):
    """A started :class:`KafkaBroker` on ``directory`` (given its ``client``; ``sasl``: its users, see
    :class:`SaslUsers`; ``settings``: broker settings over the rig's), stopped on exit: cleanly, else killed."""
    broker = KafkaBroker(directory, client=client, sasl=sasl, settings=settings)
    broker.start()
    try:
        yield broker
    finally:
        try:
            broker.stop()
        finally:
            broker.kill()  # (nothing when the stop worked)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m logfs.testing.kafka")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="resolve Kafka's jars, compile the client, try Spark's Kafka connector")
    sub.add_parser("where", help="print where the jars are, and the Spark connector's status")
    dump = sub.add_parser("dump", help="Kafka's own DumpLogSegments (the arguments are its own)")
    dump.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.command == "setup":
        try:
            setup()
        except (KafkaNotSetUp, KafkaError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    if opts.command == "where":
        print(f"kafka {kafka_version()}: {jars_dir()}")
        print(f"spark connector: {spark_connector_status()}")
        return 0
    with tempfile.TemporaryDirectory(prefix="kafka-dump.") as tmp:
        client = KafkaClient(tmp).start()
        try:
            result = client.dump(opts.args)
        finally:
            client.close()
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"] + (result["error"] or ""))
    return result["status"]


if __name__ == "__main__":
    sys.exit(main())
