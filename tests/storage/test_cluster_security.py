"""The direct Fetch's login (logfs/storage/cluster/security.py), without a broker: librdkafka's settings read as
librdkafka reads them (what the Fetch follows, what leaves every partition to the consumer, decided once and logged
in one INFO line), and SCRAM against RFC 7677's example (tests/kafka/test_kafka_store_direct_secured.py logs in to
a real broker with every mechanism)."""

from __future__ import annotations

import logging
import ssl

import pytest

from logfs.storage.cluster.replica import Replica
from logfs.storage.cluster.security import AuthenticationFailed, NotUnderstood, direct_security, plain, scram

SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p"}


@pytest.mark.parametrize("settings,protocol,mechanism", [
    ({}, "plaintext", None),
    ({"security.protocol": "PLAINTEXT"}, "plaintext", None),
    ({**SASL, "sasl.mechanism": "PLAIN"}, "sasl_plaintext", "PLAIN"),
    ({**SASL, "sasl.mechanisms": "scram-sha-256"}, "sasl_plaintext", "SCRAM-SHA-256"),  # (librdkafka's own name)
    ({**SASL, "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512"}, "sasl_ssl", "SCRAM-SHA-512"),
    ({"security.protocol": "SSL"}, "ssl", None),
])
def test_settings_the_fetch_follows(settings, protocol, mechanism):
    security = direct_security(settings)
    assert (security.protocol, security.mechanism) == (protocol, mechanism)
    assert (security.tls is not None) == protocol.endswith("ssl")
    if security.tls is not None:  # librdkafka's defaults: the certificate and the broker's host name checked
        assert security.tls.verify_mode == ssl.CERT_REQUIRED and security.tls.check_hostname


def test_tls_checks_as_librdkafka_is_told():
    lax = direct_security({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}).tls
    assert lax.verify_mode == ssl.CERT_REQUIRED and not lax.check_hostname
    none = direct_security({"security.protocol": "SSL", "enable.ssl.certificate.verification": "false"}).tls
    assert none.verify_mode == ssl.CERT_NONE and not none.check_hostname


@pytest.mark.parametrize("settings,why", [
    ({**SASL}, "GSSAPI"),  # (librdkafka's default mechanism)
    ({**SASL, "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
    ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "sasl.username"),
    ({"security.protocol": "SSL", "ssl.keystore.location": "/k.p12"}, "ssl.keystore.location"),
    ({"security.protocol": "SSL", "ssl.ca.pem": "-----BEGIN"}, "ssl.ca.pem"),
    ({"security.protocol": "SSL", "ssl.ca.certificate.stores": "Root"}, "ssl.ca.certificate.stores"),
    ({"security.protocol": "SSL", "ssl.cipher.suites": "ECDHE"}, "ssl.cipher.suites"),
    ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, "TLS files"),
    ({"security.protocol": "SSL", "ssl.key.location": "/k.pem"}, "one without the other"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldaps"}, "ldaps"),
    ({"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"}, "maybe"),
    ({"security.protocol": "KERBEROS"}, "KERBEROS"),
])
def test_settings_the_fetch_does_not_follow(settings, why):
    with pytest.raises(NotUnderstood, match=why):
        direct_security(settings)


def test_the_decision_is_one_info_line_at_start(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="logfs.storage.cluster.replica")
    off = Replica(str(tmp_path / "a"), {**SASL, "sasl.mechanism": "GSSAPI"}, 0)
    assert not off.direct
    lines = [r for r in caplog.records if r.name == "logfs.storage.cluster.replica"]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "GSSAPI" in lines[0].getMessage()
    caplog.clear()
    on = Replica(str(tmp_path / "b"), {**SASL, "sasl.mechanism": "SCRAM-SHA-512"}, 0)
    assert on.direct and on.security.mechanism == "SCRAM-SHA-512"
    assert not [r for r in caplog.records if r.name == "logfs.storage.cluster.replica"]


def test_plain_is_one_message():
    exchange = plain("alice", "secret")
    assert next(exchange) == b"\0alice\0secret"
    with pytest.raises(StopIteration):
        exchange.send(b"")


RFC7677_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"


def test_scram_sha_256_is_rfc_7677s_example():
    exchange = scram("sha256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert next(exchange) == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    assert exchange.send(RFC7677_SERVER_FIRST) == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                                   b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    with pytest.raises(StopIteration):
        exchange.send(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")


@pytest.mark.parametrize("server_final", [b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", b"e=invalid-proof"])
def test_scram_refuses_a_server_that_does_not_hold_the_password(server_final):
    exchange = scram("sha256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    next(exchange)
    exchange.send(RFC7677_SERVER_FIRST)
    with pytest.raises(AuthenticationFailed):
        exchange.send(server_final)


@pytest.mark.parametrize("server_first", [b"r=someone-elses-nonce,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
                                          b"r=rOprNGfwEbeRWgbNEkqOmore,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=1"])
def test_scram_refuses_a_foreign_nonce_or_few_iterations(server_first):
    exchange = scram("sha256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    next(exchange)
    with pytest.raises(AuthenticationFailed):
        exchange.send(server_first)


def test_scram_escapes_the_user_name():
    assert next(scram("sha512", "a=b,c", "p", nonce="n")) == b"n,,n=a=3Db=2Cc,r=n"
