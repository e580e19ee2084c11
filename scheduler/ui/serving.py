"""`PageServer`: the status page served by waitress from a thread of the calling
process (`scheduler ui` in the foreground, `scheduler demo` beside its story).

waitress: a production WSGI server in pure Python, no compiler and no event loop to
share; its few threads are plenty for a page that a handful of people keep open.
"""

from __future__ import annotations

import threading
from typing import Any

from waitress.server import create_server

from scheduler.backends import BackendSettings

from .page import create_app
from .source import PageSource


class PageServer:
    """Serves the page for `settings` on `host:port` (port 0: any free port) until
    `close()`. `url` is where to open it."""

    def __init__(self, settings: BackendSettings, *, host: str = "127.0.0.1", port: int = 0,
                 refresh_s: float = 3.0, title: str = "scheduler") -> None:
        self.source = PageSource(settings)
        try:
            self._server: Any = create_server(create_app(self.source, refresh_s=refresh_s, title=title),
                                              host=host, port=port, threads=4, ident="scheduler")
        except BaseException:
            self.source.close()
            raise
        shown_host = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown_host}:{self.port}/"
        self._thread = threading.Thread(target=self._server.run, name="status-page", daemon=True)

    @property
    def port(self) -> int:
        port: int = self._server.effective_port
        return port

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def wait(self) -> None:
        """Until the server stops (`close()` from another thread, or a signal's handler)."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def close(self) -> None:
        self._server.close()
        if self._thread.is_alive():
            self._thread.join(5)
        self.source.close()

    def __enter__(self) -> PageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
