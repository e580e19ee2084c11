"""The secure local cluster's certificates and passwords, made on this machine at its
first ``start --secure`` and kept (so restarts keep them) until ``wipe``.

Everything is under ``<cluster_dir>/secure/secrets/`` (mode 700, files 600):

- ``ca.pem`` / ``ca.key``: a CA made here, that signed every certificate below. A
  client trusts the servers by it (``SCHEDULER_*_TLS_CA``).
- ``server-<host>.pem`` / ``.key``: a server's certificate for its address (the
  subject alternative name is ``IP:<host>``, so hostname checks pass), and
  ``server-<host>-bundle.pem``, its key then its certificate, for servers that read
  one PEM keystore (Kafka, ZooKeeper, Cassandra's PEM keystore).
- ``client.pem`` / ``client.key``: the scheduler's client certificate (CN=scheduler),
  for servers that require one.
- ``<server>-<user>.password``: one random password a file: ``cassandra-admin``
  (the ``cassandra`` superuser), ``cassandra-scheduler``, ``kafka-admin`` (the brokers'
  own user), ``kafka-scheduler`` and ``kafka-reader`` (allowed to read, not to write).
- ``zookeeper-scheduler.auth``: ``scheduler:<password>``, the ZooKeeper digest identity.

Keys are RSA 2048 in PKCS#8 PEM, unencrypted (protected by the files' modes), which
Java's PEM readers and OpenSSL-based clients all take. Made with the ``openssl``
command line, which Debian installs everywhere: no Python package needed.
"""
from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from servers import ClusterError

CERT_DAYS = 3650
PASSWORDS = ("cassandra-admin", "cassandra-scheduler", "kafka-admin", "kafka-scheduler", "kafka-reader",
             "zookeeper-scheduler")
SCHEDULER_USER = "scheduler"


@dataclass(frozen=True)
class Credentials:
    """Where each secret of a secure local cluster lives (``directory``)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    def server_cert(self, host: str) -> Path:
        return self.directory / f"server-{host}.pem"

    def server_key(self, host: str) -> Path:
        return self.directory / f"server-{host}.key"

    def server_bundle(self, host: str) -> Path:
        """The server's key, then its certificate: one PEM keystore."""
        return self.directory / f"server-{host}-bundle.pem"

    def password_file(self, name: str) -> Path:
        """``name`` is one of PASSWORDS; zookeeper-scheduler's file holds ``user:password``."""
        if name not in PASSWORDS:
            raise ValueError(f"no password {name!r}; there are {', '.join(PASSWORDS)}")
        suffix = "auth" if name.startswith("zookeeper-") else "password"
        return self.directory / f"{name}.{suffix}"

    def password(self, name: str) -> str:
        text = self.password_file(name).read_text().strip()
        return text.split(":", 1)[1] if name.startswith("zookeeper-") else text

    def ensure(self, hosts: list[str]) -> None:
        """Makes whatever is missing: the CA, a certificate for each host and the
        client's, the passwords. What exists is kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        if not self.ca.exists() or not self.ca_key.exists():
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.ca_key),
                    "-out", str(self.ca), "-days", str(CERT_DAYS), "-subj", "/CN=scheduler local CA",
                    "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        for host in hosts:
            if not self.server_bundle(host).exists():
                self._sign(self.server_cert(host), self.server_key(host), f"/CN={host}",
                           f"subjectAltName=IP:{host}\nextendedKeyUsage=serverAuth,clientAuth\n")
                self._bundle(host)
        if not self.client_cert.exists() or not self.client_key.exists():
            self._sign(self.client_cert, self.client_key, f"/CN={SCHEDULER_USER}", "extendedKeyUsage=clientAuth\n")
        for name in PASSWORDS:
            path = self.password_file(name)
            if not path.exists():
                secret = secrets.token_urlsafe(24)
                write_private(path, f"{SCHEDULER_USER}:{secret}\n" if name.startswith("zookeeper-") else secret + "\n")
        for path in self.directory.iterdir():
            path.chmod(0o600)

    def _sign(self, cert: Path, key: Path, subject: str, extensions: str) -> None:
        with tempfile.TemporaryDirectory(dir=self.directory) as scratch:
            request, extfile = Path(scratch) / "request.csr", Path(scratch) / "extensions.cnf"
            extfile.write_text(extensions)
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
                    "-subj", subject)
            openssl("x509", "-req", "-in", str(request), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
                    "-CAcreateserial", "-out", str(cert), "-days", str(CERT_DAYS), "-extfile", str(extfile))
        key.chmod(0o600)

    def _bundle(self, host: str) -> None:
        write_private(self.server_bundle(host),
                      self.server_key(host).read_text() + self.server_cert(host).read_text())


def write_private(path: Path, text: str) -> None:
    """Writes ``text`` to a new file only its owner may read (never briefly world-readable)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def openssl(*args: str) -> None:
    try:
        done = subprocess.run(["openssl", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise ClusterError("the openssl command is needed to make the secure cluster's certificates: "
                           "apt-get install openssl") from None
    if done.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed (exit {done.returncode}): {done.stderr.strip()}")
