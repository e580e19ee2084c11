"""kazoo's TLS arguments from `ZooKeeperSettings.tls`, the servers a hosts string names
(each asked about TLS when no session came), and the dispatcher's --zookeeper-tls-* flags."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from scheduler.adapters.zookeeper.security import client_options
from scheduler.adapters.zookeeper.tls import PinnedTrustHandler, refusal, servers, tls_options
from scheduler.settings import TlsFiles, ZooKeeperIdentity
from tests.support import local_credentials, run_cli


def test_tls_turns_on_certificate_and_hostname_checks_and_sends_the_client_certificate() -> None:
    tls = TlsFiles(Path("/s/ca.pem"), Path("/s/client.pem"), Path("/s/client.key"))

    options = tls_options(tls)
    assert isinstance(options.pop("handler"), PinnedTrustHandler)
    assert options == {"use_ssl": True, "ca": "/s/ca.pem", "verify_certs": True, "check_hostname": True,
                       "certfile": "/s/client.pem", "keyfile": "/s/client.key"}
    assert tls_options(tls)["handler"] is not tls_options(tls)["handler"]  # one per client: it runs its threads
    assert "certfile" not in tls_options(TlsFiles(Path("/s/ca.pem")))
    assert tls_options(None) == {}


def test_client_options_carry_the_identity_and_tls_together() -> None:
    options = client_options(ZooKeeperIdentity("scheduler", "pw"), TlsFiles(Path("/s/ca.pem")))

    assert options["use_ssl"] is True and options["auth_data"] == [("digest", "scheduler:pw")]
    assert client_options(None, None) == {}


def test_servers_of_a_hosts_string() -> None:
    assert servers("a:2182,b,10.0.0.3:2183/scheduler/chroot") == [("a", 2182), ("b", 2181), ("10.0.0.3", 2183)]
    assert servers("[::1]:2281") == [("::1", 2281)]


def test_no_server_answering_is_an_outage_not_a_tls_refusal() -> None:
    assert refusal("127.0.0.1:1", None, 1.0) is None


def test_a_client_certificate_without_a_ca_is_a_usage_error(tmp_path: Path) -> None:
    cert = tmp_path / "client.pem"
    env = {name: value for name, value in os.environ.items() if not name.startswith("SCHEDULER_")}

    done = run_cli("dispatcher", "--backend", "cassandra", "--zookeeper-tls-cert", str(cert),
                   "--zookeeper-tls-key", str(cert), env=env)

    assert done.returncode == 2, done.stderr
    assert "--zookeeper-tls-cert and --zookeeper-tls-key need --zookeeper-tls-ca" in done.stderr


def test_a_server_that_closes_before_the_handshake_and_answers_no_clear_text_is_no_verdict(tmp_path: Path) -> None:
    # What a ZooKeeper at its maxClientCnxns does to every new connection: accept and
    # close. It is not a clear-text port, so not a TLS refusal either.
    ca, key = tmp_path / "ca.pem", tmp_path / "ca.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(ca),
                    "-days", "1", "-subj", "/CN=test"], check=True, capture_output=True)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        stop = threading.Event()

        def close_every_connection() -> None:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    server.accept()[0].close()
                except TimeoutError:
                    continue

        closer = threading.Thread(target=close_every_connection, daemon=True)
        closer.start()
        try:
            assert refusal(f"127.0.0.1:{port}", TlsFiles(ca, ca, key), 2.0) is None
        finally:
            stop.set()
            closer.join(timeout=5)


def test_tls_to_zookeeper_trusts_the_given_ca_alone_not_the_systems(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's CA is the machine's (SSL_CERT_FILE is where OpenSSL looks for the
    # system CAs); the client is given another. kazoo's own handler would accept the
    # server; the scheduler's must not.
    system = local_credentials(tmp_path / "system", ["127.0.0.1"])
    given = local_credentials(tmp_path / "given", [])
    monkeypatch.setenv("SSL_CERT_FILE", str(system.ca))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(str(system.server_cert("127.0.0.1")), str(system.server_key("127.0.0.1")))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            for _ in range(2):
                conn, _ = listener.accept()
                try:
                    with server_context.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    conn.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        handler = PinnedTrustHandler()

        def connect(ca: Path) -> socket.socket:
            return handler.create_connection(("127.0.0.1", port), hostname="127.0.0.1", timeout=10.0, use_ssl=True,
                                             ca=str(ca), verify_certs=True, check_hostname=True)

        with pytest.raises(ssl.SSLCertVerificationError):
            connect(given.ca)
        accepted = connect(system.ca)
        with accepted:
            assert accepted.recv(2) == b"ok"  # the server's own CA, given: accepted, checked for 127.0.0.1
        thread.join(timeout=10)
