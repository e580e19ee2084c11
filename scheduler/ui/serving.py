"""`PageServer`: the status page served by waitress from a thread of the calling
process (`scheduler ui` in the foreground, `scheduler demo` beside its story).

waitress: a production WSGI server in pure Python, no compiler and no event loop to
share; its few threads are plenty for a page that a handful of people keep open.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from typing import Any

from waitress import wasyncore
from waitress.server import create_server

from scheduler.backends import BackendSettings

from .credentials import Credentials
from .page import create_app, trusted_hosts
from .source import PageSource


def resolve(host: str, port: int) -> str:
    """One numeric address for `host` (`localhost` can name two, and the page listens on
    one); `ValueError` if it names none."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"{host!r} names no address: {exc.strerror}") from None
    return str(infos[0][4][0])


class PageServer:
    """Serves the page for `settings` on `host:port` (port 0: any free port) until
    `close()`. `url` is where to open it. `OSError` when the address cannot be listened
    on, `ValueError` when `host` names no address, or names one that is not loopback and
    there are no `credentials` (a page anyone on the network could use).

    With `credentials`, the page needs a login; its session cookie is `Secure` unless the
    address is loopback, so off loopback the page must be reached over HTTPS (a proxy
    in front that ends TLS), which also keeps secrets off the network in the clear."""

    def __init__(self, settings: BackendSettings, *, host: str = "127.0.0.1", port: int = 0,
                 refresh_s: float = 3.0, title: str = "scheduler", credentials: Credentials | None = None) -> None:
        address = resolve(host, port)
        loopback = ipaddress.ip_address(address).is_loopback
        if credentials is None and not loopback:
            raise ValueError(f"{address} is not a loopback address, and without --credentials the page has no "
                             "login: serve it on 127.0.0.1, or give it a credentials file")
        self.source = PageSource(settings)
        try:
            app = create_app(self.source, refresh_s=refresh_s, title=title, hosts=trusted_hosts(host, address),
                             credentials=credentials, secure_cookie=not loopback)
            self._server: Any = create_server(app, host=address, port=port, threads=4, ident="scheduler")
        except BaseException:
            self.source.close()
            raise
        shown = f"[{address}]" if ":" in address else address
        self.url = f"http://{shown}:{self.port}/"
        self._thread = threading.Thread(target=self._server.run, name="status-page", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.effective_port
        return port

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def wait(self, stop: threading.Event) -> None:
        """Until `stop` is set or the server ends."""
        while self._thread.is_alive() and not stop.wait(0.5):
            pass

    def close(self) -> None:
        """Stop listening, end every open connection (a browser keeps one) and the
        request threads, then close the stores: no request runs on a closed store."""
        self._server.task_dispatcher.shutdown()
        wasyncore.close_all(self._server._map)
        if self._thread.is_alive():
            self._thread.join(10)
        self.source.close()

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
