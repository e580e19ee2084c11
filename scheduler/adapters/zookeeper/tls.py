"""TLS to ZooKeeper (its `secureClientPort`): kazoo's arguments for it, and why a
session could not be had when TLS is what failed.

With `ZooKeeperSettings.tls`, every connection is TLS: the server must show a certificate
signed by the CA, for the address dialled (kazoo 2.11 leaves `check_hostname` off by
default, and checks only the chain: it is turned on here, so a certificate of another
host is refused as well), and the client shows its own certificate and key, which a server
with `ssl.clientAuth=need` requires.

Whom it trusts: the CA given, and nothing else. kazoo 2.11 loads the machine's system CAs
before the given one, so a certificate a public CA issued for the dialled name would be
accepted too; `PinnedTrustHandler`, the handler every client here is made with, makes
its TLS connections with a context that holds the given CA alone.

How it fails: kazoo does not report a failed handshake. A server that refuses the
client's certificate (or its lack of one), a server certificate the CA does not vouch
for, or clear text spoken to a TLS-only port all look alike to it: a connection that
drops, retried quietly until `start` times out, as if ZooKeeper were down. So after such
a timeout the coordinator calls `refusal`, which makes one TLS handshake itself to each
server, with the same files, and returns what the first server that answered objected
to; None when no server answered at all, or every one accepted: an outage, not a setting.
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler

from scheduler.settings import TlsFiles

SETTINGS = "SCHEDULER_ZOOKEEPER_TLS_CA, _TLS_CERT and _TLS_KEY (--zookeeper-tls-ca, --zookeeper-tls-cert, --zookeeper-tls-key)"
"""Where the files are given: named in every refusal."""

ALERT_WAIT_S = 2.0
"""How long to wait, after a handshake that looked complete, for the server's verdict on
the client's certificate: under TLS 1.3 a server sends it after the handshake (the
`certificate required` or `bad certificate` alert), and says nothing if it accepts."""


def tls_options(tls: TlsFiles | None) -> dict[str, Any]:
    """`KazooClient` keyword arguments: TLS with these files, trusting their CA alone, or
    nothing (clear text)."""
    if tls is None:
        return {}
    options: dict[str, Any] = {"use_ssl": True, "ca": str(tls.ca), "verify_certs": True, "check_hostname": True,
                               "handler": PinnedTrustHandler()}
    if tls.cert is not None and tls.key is not None:
        options |= {"certfile": str(tls.cert), "keyfile": str(tls.key)}
    return options


class PinnedTrustHandler(SequentialThreadingHandler):  # type: ignore[misc]  # kazoo is untyped
    """kazoo's threading handler, whose TLS connections trust only the CA they are given
    (see the module docstring); clear-text connections are kazoo's own. One per client."""

    def create_connection(self, address: tuple[str, int], hostname: str | None = None,
                          timeout: float | None = None, use_ssl: bool = False, ca: str | None = None,
                          certfile: str | None = None, keyfile: str | None = None,
                          keyfile_password: str | None = None, verify_certs: bool = True,
                          check_hostname: bool = False, options: ssl.Options | None = None,
                          ciphers: str | None = None) -> socket.socket:
        if not use_ssl:
            plain: socket.socket = super().create_connection(address, hostname=hostname, timeout=timeout)
            return plain
        if not ca or not verify_certs:
            raise ValueError("TLS to ZooKeeper needs a CA to check the server's certificate against")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # TLS 1.2 at least, no system CAs
        if options is not None:
            context.options = options
        if ciphers:
            context.set_ciphers(ciphers)
        context.check_hostname = check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(ca)
        if certfile and keyfile:
            context.load_cert_chain(certfile=certfile, keyfile=keyfile, password=keyfile_password)
        family = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as kazoo sets its own
            sock = context.wrap_socket(sock, server_hostname=hostname)  # takes over the descriptor
            sock.settimeout(timeout)
            sock.connect(address)  # the handshake, checked against `ca` alone
        except BaseException:
            sock.close()  # kazoo leaves a refused one to the garbage collector
            raise
        return sock


def servers(hosts: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a kazoo hosts string (`a:2181,b,c:2182/chroot`)."""
    found = []
    for entry in hosts.split("/", 1)[0].split(","):
        entry = entry.strip()
        if not entry:
            continue
        if entry.startswith("["):  # [IPv6]:port
            host, _, port = entry[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, _, port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        found.append((host, int(port) if port.isdigit() else 2181))
    return found


def refusal(hosts: str, tls: TlsFiles | None, timeout_s: float) -> str | None:
    """What the first server of `hosts` that answers objects to in a TLS handshake made
    with `tls` (or, without TLS, whether it speaks only TLS), as a message naming the
    server, the cause and the settings to check; None if none objects or none answers."""
    for host, port in servers(hosts):
        problem = _handshake_problem(host, port, tls, timeout_s)
        if problem is not None:
            return f"ZooKeeper at {host}:{port} {problem}"
    return None


def _context(tls: TlsFiles | None) -> ssl.SSLContext:
    if tls is None:  # only to learn whether the port speaks TLS: nothing is trusted or sent
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    context = ssl.create_default_context(cafile=str(tls.ca))
    if tls.cert is not None and tls.key is not None:
        context.load_cert_chain(str(tls.cert), str(tls.key))
    return context


def _handshake_problem(host: str, port: int, tls: TlsFiles | None, timeout_s: float) -> str | None:
    try:
        context = _context(tls)
    except (OSError, ssl.SSLError) as exc:  # a file missing, unreadable, or not PEM
        return f"could not be reached over TLS: the TLS files cannot be used ({exc}); check {SETTINGS}"
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return None  # not answering: an outage
    shook = False  # whether the server got as far as showing its certificate
    try:
        with raw, context.wrap_socket(raw, server_hostname=host) as sock:
            shook = True
            sock.settimeout(ALERT_WAIT_S)
            try:
                sock.recv(1)
            except TimeoutError:
                pass  # nothing said: the certificate was accepted
    except ssl.SSLCertVerificationError as exc:
        return (f"showed a certificate this client does not trust ({exc.verify_message}): check that "
                f"SCHEDULER_ZOOKEEPER_TLS_CA ({tls.ca if tls else 'not set'}) is the CA that signed the server's "
                "certificate, and that the certificate is for this address")
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
        if tls is None:
            return _CLEAR_TEXT if shook else None
        if not shook and "EOF" in reason and not _speaks_clear_text(host, port, timeout_s):
            # Closed before the handshake, and no answer in clear text either: a server
            # at its connection limit (maxClientCnxns) or shutting down. No verdict.
            return None
        if not shook and any(sign in reason for sign in ("EOF", "WRONG_VERSION", "RECORD_LAYER")):
            return (f"does not speak TLS on this port ({reason}): check that the port is its secureClientPort, "
                    f"or leave {SETTINGS} unset for a clear-text clientPort")
        if tls.cert is None:
            return (f"refused the TLS connection ({reason}): it requires a client certificate and none is given; "
                    "set SCHEDULER_ZOOKEEPER_TLS_CERT and _TLS_KEY (--zookeeper-tls-cert, --zookeeper-tls-key)")
        return (f"refused the client certificate {tls.cert} ({reason}): it must be signed by a CA the server "
                f"trusts (its ssl.trustStore); check {SETTINGS}")
    except OSError:
        return _CLEAR_TEXT if tls is None and shook else None  # reset mid-handshake: no verdict
    return _CLEAR_TEXT if tls is None else None


def _speaks_clear_text(host: str, port: int, timeout_s: float) -> bool:
    """Whether the server answers a clear-text ZooKeeper connect request: a plain
    clientPort closes a TLS hello unanswered, as a server at its connection limit closes
    any connection, and only this tells the two apart. The session it may open is left
    to expire (its timeout is the server's minimum)."""
    password = bytes(16)
    request = (struct.pack(">iqiqi", 0, 0, 1, 0, len(password)) + password + b"\x00")
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            return len(sock.recv(4)) == 4
    except OSError:
        return False


_CLEAR_TEXT = (f"speaks only TLS on this port and the scheduler spoke clear text: set {SETTINGS} to the CA of "
               "the server's certificate and the scheduler's client certificate and key")
