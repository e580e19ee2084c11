"""Telling a Cassandra that refused the scheduler from one that is not there.

The driver reports a failed connection as `NoHostAvailable`, holding one exception per
node it tried; a refusal is among them as an `AuthenticationFailed` (a wrong password,
or no login where one is required) or a TLS error (a server certificate the CA does not
vouch for, no client certificate, TLS on one side only). A statement the role is not
granted fails with `Unauthorized`. Each of these is a setting to fix, so it becomes a
`StoreAccessDenied` (the CLI's exit 2) whose message names the node, the user, what was
refused and the `SCHEDULER_CASSANDRA_*` variable to check, never a password. What is
left (nodes down, unreachable, timing out) stays a `StoreUnavailable`.
"""

from __future__ import annotations

import re
import socket
import ssl
from typing import Any

from cassandra import AuthenticationFailed, Unauthorized
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionShutdown
from cassandra.protocol import UnauthorizedErrorMessage

from scheduler.errors import ConfigError, StoreAccessDenied, StoreError, StoreUnavailable
from scheduler.settings import CassandraSettings, TlsFiles

TLS_PROBE_TIMEOUT_S = 3.0

_CREDENTIAL_SETTINGS = "SCHEDULER_CASSANDRA_USERNAME and SCHEDULER_CASSANDRA_PASSWORD_FILE"


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """TLS that trusts only the CA in `tls.ca`, checks the server's certificate against the
    address dialled, and presents this client's certificate when one is given. A file that
    cannot be used is a `ConfigError` naming its variable."""
    tls.check("Cassandra")
    try:
        context = ssl.create_default_context(cafile=str(tls.ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"SCHEDULER_CASSANDRA_TLS_CA={tls.ca} holds no usable CA certificate (PEM): {exc}") from None
    if tls.cert is not None and tls.key is not None:
        try:
            context.load_cert_chain(str(tls.cert), str(tls.key))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"SCHEDULER_CASSANDRA_TLS_CERT={tls.cert} and SCHEDULER_CASSANDRA_TLS_KEY={tls.key} are not a PEM "
                f"certificate and its unencrypted private key: {exc}"
            ) from None
    return context


def connect_failure(exc: NoHostAvailable, settings: CassandraSettings) -> StoreError:
    """The error to raise for a connection that no node accepted: `StoreAccessDenied` if
    any node answered and refused (the others may be down: the setting is wrong either
    way), else `StoreUnavailable`."""
    errors: dict[Any, BaseException] = dict(exc.errors or {})
    refused = [message for node, error in errors.items()
               if (message := refusal(node_address(node, settings), error, settings)) is not None]
    if refused:
        return StoreAccessDenied(" ".join(refused))
    where = ", ".join(f"{host}:{settings.port}" for host in settings.hosts)
    return StoreUnavailable(
        f"cannot reach Cassandra at {where} ({exc}). Is it running? For the local cluster run "
        "`python deploy/local/cluster.py start`; elsewhere set SCHEDULER_CASSANDRA_HOSTS and "
        "SCHEDULER_CASSANDRA_PORT."
    )


def node_address(node: object, settings: CassandraSettings) -> tuple[str, int]:
    """(host, port) of a key of `NoHostAvailable.errors` ("10.0.0.1:9042", or an endpoint)."""
    host, colon, port = str(node).rpartition(":")
    if colon and port.isdigit():
        return host.strip("[]"), int(port)
    return str(node), settings.port


def refusal(address: tuple[str, int], error: BaseException, settings: CassandraSettings) -> str | None:
    """What a node at `address` refused and what to set, or None if `error` is no
    refusal (the node is down, unreachable or slow)."""
    where = f"Cassandra at {address[0]}:{address[1]}"
    user = settings.username
    if isinstance(error, AuthenticationFailed):
        if "Unable to perform authentication" in str(error):
            # PasswordAuthenticator could not read its roles (system_auth replicas down
            # or slow): the login was not judged, so this is an outage.
            return None
        if user is None:
            return (f"{where} requires a login (PasswordAuthenticator) and none was given: set "
                    f"{_CREDENTIAL_SETTINGS} (or --cassandra-username and --cassandra-password-file).")
        return (f"{where} refused the login of user {user!r}: {server_reason(error)}. Check "
                f"{_CREDENTIAL_SETTINGS}{password_source(settings)}.")
    text = str(error)
    if settings.tls is not None and closed_by_peer(error) and not tls_alert(text):
        # A TLS 1.3 server refuses a client certificate after the handshake: the driver may
        # see the connection close before it reads the alert. Ask again, and read it.
        text = f"{text} {tls_answer(*address, tls_context(settings.tls))}"
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (f"{where} presented a certificate that SCHEDULER_CASSANDRA_TLS_CA ({tls_ca(settings)}) does not "
                f"vouch for, or not for the address dialled: {tls_reason(text)}. Give the CA that signed the "
                "nodes' certificates, and contact points the certificates name (SCHEDULER_CASSANDRA_HOSTS).")
    no_cert = settings.tls is not None and settings.tls.cert is None
    if "CERTIFICATE_REQUIRED" in text or ("HANDSHAKE_FAILURE" in text and no_cert):
        return (f"{where} requires a client certificate (client_encryption_options require_client_auth) and none "
                "was given: set SCHEDULER_CASSANDRA_TLS_CERT and SCHEDULER_CASSANDRA_TLS_KEY.")
    if any(alert in text for alert in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN",
                                       "UNSUPPORTED_CERTIFICATE", "CERTIFICATE_EXPIRED", "CERTIFICATE_REVOKED")):
        cert = settings.tls.cert if settings.tls else None
        return (f"{where} refused this client's certificate (SCHEDULER_CASSANDRA_TLS_CERT={cert}): "
                f"{tls_reason(text)}. Use a certificate signed by a CA in the server's truststore.")
    if "ALERT_INTERNAL_ERROR" in text and settings.tls is not None and settings.tls.cert is not None:
        # What Cassandra's TLS (netty on BoringSSL) answers a client certificate its
        # truststore does not vouch for.
        return (f"{where} ended the TLS handshake ({tls_reason(text)}), as it does for a client certificate it does "
                f"not trust: check that SCHEDULER_CASSANDRA_TLS_CERT={settings.tls.cert} is signed by a CA in the "
                "server's truststore (client_encryption_options), and the server's log.")
    if "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER_FAILURE" in text:
        return (f"{where} does not speak TLS on this port: unset SCHEDULER_CASSANDRA_TLS_CA (and _CERT, _KEY) if "
                "the cluster does not encrypt client connections, or check SCHEDULER_CASSANDRA_PORT.")
    if settings.tls is None and closed_by_peer(error) and speaks_tls(*address):
        return (f"{where} accepts only TLS connections (client_encryption_options) and this client connected "
                "without: set SCHEDULER_CASSANDRA_TLS_CA to the CA that signed its certificate, and "
                "SCHEDULER_CASSANDRA_TLS_CERT and _KEY if it requires a client certificate.")
    return None


def raise_if_denied(exc: BaseException, session: Any, doing: str) -> None:
    """Raises `denial`'s `StoreAccessDenied` if `exc` is one; returns otherwise, for the
    caller to raise its own error."""
    if (denied := denial(exc, session, doing)) is not None:
        raise denied from exc


def denial(exc: BaseException, session: Any, doing: str) -> StoreAccessDenied | None:
    """`StoreAccessDenied` when `exc` is the server refusing the session's role `doing`
    (e.g. "the task store's insert") for want of a permission, else None."""
    if not isinstance(exc, Unauthorized | UnauthorizedErrorMessage):
        return None
    cluster = getattr(session, "cluster", None)
    hosts = ", ".join(f"{host}:{getattr(cluster, 'port', '?')}" for host in getattr(cluster, "contact_points", ()))
    user = getattr(getattr(cluster, "auth_provider", None), "username", None)
    return StoreAccessDenied(
        f"Cassandra at {hosts or 'the cluster'} refused user {user!r} {doing}: {server_reason(exc)}. Grant the "
        "role what the scheduler needs (e.g. GRANT ALL PERMISSIONS ON KEYSPACE <keyspace> TO <role>), or check "
        "SCHEDULER_CASSANDRA_USERNAME and SCHEDULER_KEYSPACE."
    )


def server_reason(error: BaseException) -> str:
    """The server's own words in a driver error (`message="..."`), else the error."""
    text = str(error)
    if 'message="' in text:
        return text.split('message="', 1)[1].rstrip('"\')')
    return text


def tls_reason(text: str) -> str:
    """The OpenSSL reason in a driver's TLS error text, without the driver's wrapping."""
    reason = text.rsplit("Last error: ", 1)[-1]
    return re.sub(r"\s*\(_ssl\.c:\d+\)", "", reason).strip("\"')").strip()


def password_source(settings: CassandraSettings) -> str:
    if settings.password_file is not None:
        return f" (the password is read from {settings.password_file})"
    return " (the password came from SCHEDULER_CASSANDRA_PASSWORD)" if settings.password is not None else ""


def tls_ca(settings: CassandraSettings) -> str:
    return str(settings.tls.ca) if settings.tls is not None else "none given"


def closed_by_peer(error: BaseException) -> bool:
    """Whether the node accepted the connection and then closed it, as a TLS port does to
    a plain client and a TLS 1.3 server may to a client certificate it refuses (rather
    than refusing the connection, or not answering: those are outages)."""
    return isinstance(error, ConnectionResetError | ConnectionAbortedError | BrokenPipeError | ssl.SSLEOFError
                      | ConnectionShutdown)


def tls_alert(text: str) -> bool:
    """Whether a TLS error's text already says what the server (or this client) refused."""
    return any(word in text for word in ("ALERT", "CERTIFICATE_VERIFY_FAILED", "WRONG_VERSION_NUMBER"))


def tls_answer(host: str, port: int, context: ssl.SSLContext) -> str:
    """The TLS error a new connection with `context` to `host:port` meets, up to the first
    byte the server sends (a refusal arrives then, as an alert), or "" if none does."""
    try:
        with socket.create_connection((host, port), timeout=TLS_PROBE_TIMEOUT_S) as sock, \
                context.wrap_socket(sock, server_hostname=host) as tls:
            tls.recv(1)  # the server says nothing first in CQL: an alert, or the timeout
    except ssl.SSLError as exc:
        return str(exc)
    except OSError:
        return ""
    return ""


def speaks_tls(host: str, port: int) -> bool:
    """Whether the server at `host:port` answers a TLS hello (its certificate unchecked:
    this only tells a TLS port from a plain one, after a plain connection failed)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=TLS_PROBE_TIMEOUT_S) as sock, \
                context.wrap_socket(sock):
            return True
    except ssl.SSLError as exc:
        return "ALERT" in str(exc).upper()  # the server spoke TLS, to refuse this hello
    except OSError:
        return False
