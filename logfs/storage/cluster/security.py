"""How the direct Fetch (:mod:`.fetch`) logs in: librdkafka's security settings read as librdkafka reads them.

The replica's consumer (librdkafka) and its direct Fetch must reach the cluster as the same client: the same
``-o kafka.*`` settings give the same TLS (trusted CAs, client certificate, host name check) and the same SASL
login. :func:`direct_security` decides once, from the settings, whether the Fetch can do that:

- ``security.protocol`` ``plaintext`` (librdkafka's default), ``ssl``, ``sasl_plaintext``, ``sasl_ssl`` (any case).
- SASL: ``sasl.mechanism`` (or librdkafka's ``sasl.mechanisms``; librdkafka's default is GSSAPI) ``PLAIN``,
  ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (RFC 5802, RFC 7677: the server's signature is checked, so a broker that
  does not hold the password is not believed), with ``sasl.username`` and ``sasl.password``.
- TLS (Python's :mod:`ssl`): ``ssl.ca.location`` (a file or a directory of CA certificates; unset or ``probe``: the
  system's, as librdkafka on Linux), ``ssl.certificate.location`` with ``ssl.key.location`` (and
  ``ssl.key.password``) for a client certificate, ``ssl.endpoint.identification.algorithm`` (``https``, the default:
  the broker's host name is checked against its certificate; ``none``: not), ``enable.ssl.certificate.verification``
  (``false``: no check at all).

Anything else that changes how librdkafka connects (GSSAPI, OAUTHBEARER, a PKCS#12 keystore, PEM given inline,
certificate stores, cipher, curve or signature lists, a CRL, engines and providers, a verification callback) is not
understood: :class:`NotUnderstood` says which, and the consumer fetches everything, as it did before the Fetch
spoke anything but PLAINTEXT. Files that cannot be loaded (a wrong key password) are the same: the consumer then
reports them.

The SASL mechanisms are exchanges with no IO (h11's way): a generator yields the client's messages and is sent
the server's answers; :class:`.fetch.Connection` carries them in SaslAuthenticate requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import ssl
from collections.abc import Generator
from dataclasses import dataclass

PROTOCOLS = ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")
MECHANISMS = {"PLAIN": None, "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}  # -> SCRAM's hash
# librdkafka's settings that change how it connects and that the direct Fetch does not follow (CONFIGURATION.md)
UNDERSTOOD_SSL = {"ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password",
                  "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification"}
NOT_UNDERSTOOD_SSL = ("ssl.key.pem", "ssl_key", "ssl.certificate.pem", "ssl_certificate", "ssl.ca.pem", "ssl_ca",
                      "ssl.ca.certificate.stores", "ssl.crl.location", "ssl.keystore.location",
                      "ssl.keystore.password", "ssl.providers", "ssl.engine.location", "ssl.engine.id",
                      "ssl_engine_callback_data", "ssl.certificate.verify_cb", "ssl.cipher.suites",
                      "ssl.curves.list", "ssl.sigalgs.list")
SCRAM_MIN_ITERATIONS = 4096  # RFC 7677's minimum, and Kafka's: fewer from a "broker" is a downgrade


class NotUnderstood(Exception):
    """Settings the direct Fetch cannot follow as librdkafka does: the consumer fetches everything."""


class AuthenticationFailed(Exception):
    """The broker refused the login (or proved not to hold the password: SCRAM's server signature)."""


@dataclass(frozen=True)
class DirectSecurity:
    """What a direct Fetch connection does before its first request: TLS with ``tls`` (None: plain TCP), then a
    SASL login with ``mechanism`` (None: none)."""
    protocol: str
    tls: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str = ""
    password: str = ""

    def exchange(self) -> Generator[bytes, bytes, None]:
        """The SASL exchange of :attr:`mechanism` (see the module's docstring)."""
        if self.mechanism == "PLAIN":
            return plain(self.username, self.password)
        return scram(MECHANISMS[self.mechanism], self.username, self.password)


def _bool(settings: dict, name: str, default: bool) -> bool:
    value = settings.get(name)
    if value is None:
        return default
    text = str(value).strip().lower()
    if text in ("true", "t", "1"):
        return True
    if text in ("false", "f", "0"):
        return False
    raise NotUnderstood(f"{name}={value}")


def direct_security(settings: dict) -> DirectSecurity:
    """The direct Fetch's security for librdkafka's ``settings``; raises :class:`NotUnderstood` (saying why)."""
    protocol = str(settings.get("security.protocol", "plaintext")).lower()
    if protocol not in PROTOCOLS:
        raise NotUnderstood(f"security.protocol={settings.get('security.protocol')}")
    tls = _tls_context(settings) if protocol in ("ssl", "sasl_ssl") else None
    if not protocol.startswith("sasl_"):
        return DirectSecurity(protocol, tls)
    mechanism = str(settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "GSSAPI"))).upper()
    if mechanism not in MECHANISMS:
        raise NotUnderstood(f"the SASL mechanism {mechanism}")
    username, password = settings.get("sasl.username"), settings.get("sasl.password")
    if username is None or password is None:
        raise NotUnderstood(f"SASL {mechanism} without sasl.username and sasl.password")
    return DirectSecurity(protocol, tls, mechanism, str(username), str(password))


def _tls_context(settings: dict) -> ssl.SSLContext:
    given = sorted(name for name in NOT_UNDERSTOOD_SSL if settings.get(name) not in (None, ""))
    if given:
        raise NotUnderstood(", ".join(given))
    verify = _bool(settings, "enable.ssl.certificate.verification", True)
    identification = str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower()
    if identification not in ("https", "none"):
        raise NotUnderstood(f"ssl.endpoint.identification.algorithm={identification}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = verify and identification == "https"
    context.verify_mode = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
    ca = settings.get("ssl.ca.location")
    cert, key = settings.get("ssl.certificate.location"), settings.get("ssl.key.location")
    try:
        if verify:
            if ca in (None, "", "probe"):
                context.load_default_certs()  # (librdkafka: OpenSSL's default paths, or the probed ones)
            elif os.path.isdir(str(ca)):
                context.load_verify_locations(capath=str(ca))
            else:
                context.load_verify_locations(cafile=str(ca))
        if cert or key:
            if not (cert and key):
                raise NotUnderstood("ssl.certificate.location and ssl.key.location, one without the other")
            password = settings.get("ssl.key.password")
            context.load_cert_chain(str(cert), str(key), None if password is None else str(password))
    except (OSError, ssl.SSLError) as exc:  # (a file missing, a key its password does not open)
        raise NotUnderstood(f"the TLS files: {exc}") from None
    return context


# -- SASL mechanisms: no IO ---------------------------------------------------------------------------------------
def plain(username: str, password: str) -> Generator[bytes, bytes, None]:
    """RFC 4616: one message (no authorization identity), whatever the server answers (an error comes as
    SaslAuthenticate's error code)."""
    yield b"\0" + username.encode() + b"\0" + password.encode()


def _saslname(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


def scram(hash_name: str, username: str, password: str, nonce: str | None = None) -> Generator[bytes, bytes, None]:
    """RFC 5802 (SHA-256: RFC 7677; SHA-512 as Kafka's): client-first, client-final, then the server's signature
    checked (:class:`AuthenticationFailed` when it is wrong or the server answers ``e=``). ``nonce``: tests only."""
    nonce = nonce or base64.b64encode(os.urandom(24)).decode()
    first_bare = f"n={_saslname(username)},r={nonce}"
    server_first = (yield ("n,," + first_bare).encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(",") if "=" in part)
    if server_first.startswith("e=") or "e" in fields:
        raise AuthenticationFailed(f"SCRAM: {fields.get('e', server_first)}")
    server_nonce, iterations = fields.get("r", ""), int(fields.get("i", "0"))
    if not server_nonce.startswith(nonce) or len(server_nonce) == len(nonce):
        raise AuthenticationFailed("SCRAM: the server's nonce does not extend the client's")
    if iterations < SCRAM_MIN_ITERATIONS:
        raise AuthenticationFailed(f"SCRAM: {iterations} iterations (at least {SCRAM_MIN_ITERATIONS})")
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), base64.b64decode(fields["s"]), iterations)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    final_bare = f"c=biws,r={server_nonce}"  # (biws: "n,," in base64, no channel binding)
    auth_message = f"{first_bare},{server_first},{final_bare}".encode()
    signature = hmac.digest(hashlib.new(hash_name, client_key).digest(), auth_message, hash_name)
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    server_final = (yield f"{final_bare},p={base64.b64encode(proof).decode()}".encode()).decode()
    if server_final.startswith("e="):
        raise AuthenticationFailed(f"SCRAM: {server_final[2:]}")
    want = hmac.digest(hmac.digest(salted, b"Server Key", hash_name), auth_message, hash_name)
    if not server_final.startswith("v=") or not hmac.compare_digest(base64.b64decode(server_final[2:]), want):
        raise AuthenticationFailed("SCRAM: the server's signature is wrong (it does not hold the password)")
