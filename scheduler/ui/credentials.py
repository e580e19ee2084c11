"""The status page's credentials file: who may log in, and what each one may see.

One credential a line, `NAME SCOPE HASH`, blank lines and `#` comments allowed:

    ops        all             scrypt$16384$8$1$<salt>$<key>
    acme-desk  tenant:acme     scrypt$16384$8$1$<salt>$<key>

`all` sees every tenant and may replay and cancel anything; `tenant:X` sees and acts on
tenant X's tasks and dead letters only. Only a salted scrypt hash of each secret is
stored (the standard library's, so nothing is added to install); a secret is never
written to the file, a log or the command line (`add_credential` makes one and the
caller prints it once). The file must not be writable by group or others: whoever can
write it can let themselves in.

A file that cannot be used (unreadable, writable by others, a bad line, an unknown
scope, a name given twice, no credential at all) is a `CredentialsError` naming the
file and line, so the page refuses to start rather than serving with fewer rules.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from scheduler.model import valid_name

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
"""scrypt's cost: about 16 MiB and some tens of milliseconds a check, so a stolen file
is slow to guess at, and a login still answers at once."""
KEY_BYTES = 32
SALT_BYTES = 16
SECRET_BYTES = 24
"""A made secret: 24 random bytes (192 bits), as 32 URL-safe characters."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
ALL = "all"
TENANT_PREFIX = "tenant:"


class CredentialsError(Exception):
    """A credentials file that cannot be used, or a credential that cannot be added."""


@dataclass(frozen=True)
class Credential:
    name: str
    tenant: str | None
    """The one tenant this credential sees; None for `all`."""
    hash: str

    @property
    def scope(self) -> str:
        return ALL if self.tenant is None else TENANT_PREFIX + self.tenant


def parse_scope(text: str) -> str | None:
    """The tenant of a scope (`all` -> None, `tenant:X` -> X); `ValueError` otherwise."""
    if text == ALL:
        return None
    if text.startswith(TENANT_PREFIX) and valid_name(text[len(TENANT_PREFIX):]) \
            and not any(c.isspace() for c in text):
        return text[len(TENANT_PREFIX):]
    raise ValueError(f"unknown scope {text!r}: it is `all` or `tenant:NAME` (a tenant name without spaces)")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad credential name {name!r}: 1 to 64 of letters, digits and . _ @ -, "
                         "starting with a letter or digit")
    return name


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    key = hashlib.scrypt(secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=KEY_BYTES)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(key)}"


def _check_hash(text: str) -> tuple[int, int, int, bytes, bytes]:
    fields = text.split("$")
    if len(fields) != 6 or fields[0] != "scrypt":
        raise ValueError("the hash is not scrypt$N$R$P$SALT$KEY (make lines with `scheduler ui add-credential`)")
    try:
        n, r, p = int(fields[1]), int(fields[2]), int(fields[3])
        salt, key = _unb64(fields[4]), _unb64(fields[5])
    except ValueError:
        raise ValueError("the hash's numbers or base64 cannot be read") from None
    if not (2 <= n <= 2**20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16 and salt and len(key) >= 16):
        raise ValueError("the hash's scrypt parameters are out of range")
    return n, r, p, salt, key


def matches(secret: str, hashed: str) -> bool:
    """Whether `secret` is the one `hashed` was made from; the keys compared in constant time."""
    n, r, p, salt, key = _check_hash(hashed)
    given = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024 * 1024, dklen=len(key))
    return hmac.compare_digest(given, key)


_DECOY = hash_secret(secrets.token_urlsafe(SECRET_BYTES))
"""Checked against for a name that is not in the file, so an unknown name takes as long
as a wrong secret and the timing does not say which names exist."""


class Credentials:
    def __init__(self, credentials: list[Credential]) -> None:
        self._by_name = {c.name: c for c in credentials}

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Credential | None:
        return self._by_name.get(name)

    def verify(self, name: str, secret: str) -> Credential | None:
        """The credential `name` if `secret` is its secret, else None (always one scrypt)."""
        found = self._by_name.get(name)
        ok = matches(secret, found.hash if found is not None else _DECOY)
        return found if ok and found is not None else None


def parse(text: str, where: str) -> list[Credential]:
    """The credentials of a file's `text`; `CredentialsError` at the first bad line."""
    found: dict[str, Credential] = {}
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        fields = stripped.split()
        try:
            if len(fields) != 3:
                raise ValueError(f"expected `NAME SCOPE HASH`, got {len(fields)} field(s)")
            name, scope, hashed = fields
            check_name(name)
            tenant = parse_scope(scope)
            _check_hash(hashed)
            if name in found:
                raise ValueError(f"the name {name!r} is given twice")
        except ValueError as exc:
            raise CredentialsError(f"{where}, line {number}: {exc}") from None
        found[name] = Credential(name, tenant, hashed)
    return list(found.values())


def load(path: Path) -> Credentials:
    """The credentials in `path`; `CredentialsError` for any file that cannot be used."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise CredentialsError(f"{path} is not a file")
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise CredentialsError(f"{path} is writable by group or others (mode {stat.S_IMODE(mode):o}): "
                                   f"whoever can write it can let themselves in; chmod 600 {path}")
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CredentialsError(f"{path} is not UTF-8 text") from None
    credentials = parse(text, str(path))
    if not credentials:
        raise CredentialsError(f"{path} holds no credential: no one could log in "
                               "(add one with `scheduler ui add-credential`)")
    return Credentials(credentials)


def new_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def add_credential(path: Path, name: str, scope: str, secret: str) -> Credential:
    """Appends a line for `name` with `scope` and the hash of `secret` to `path` (made,
    mode 600, with its missing directories, mode 700, when missing). `CredentialsError` if the name is taken or the file is bad."""
    try:
        check_name(name)
        tenant = parse_scope(scope)
    except ValueError as exc:
        raise CredentialsError(str(exc)) from None
    if not secret or secret != secret.strip() or "\n" in secret:
        raise CredentialsError("a secret must be non-empty, on one line, without spaces at either end")
    if path.exists():
        existing = load(path)
        if existing.get(name) is not None:
            raise CredentialsError(f"{path} already has a credential named {name!r}")
    credential = Credential(name, tenant, hash_secret(secret))
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # e.g. ~/.config/scheduler on a new machine
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as file:
            if file.tell() and not path.read_bytes().endswith(b"\n"):
                file.write("\n")
            file.write(f"{credential.name} {credential.scope} {credential.hash}\n")
    except OSError as exc:
        raise CredentialsError(f"cannot write {path}: {exc.strerror or exc}") from None
    return credential
