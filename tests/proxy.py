"""`TcpProxy`: a TCP forwarder on 127.0.0.1 that a test can cut and restore, to put a
network failure between a client and its server.

Threads, no asyncio: one accepts, two pump each connection (one per direction). `cut()`
shuts every open connection down and, until `restore()`, closes each new one as soon as
it is accepted, so the client sees its connection break and every reconnect fail.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from types import TracebackType


class _Pair:
    """A client connection and its upstream; the last of its two pumps to finish closes both."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self._running = 2
        self._lock = threading.Lock()

    def shut(self) -> None:
        for sock in (self.client, self.upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already shut, or never connected

    def pump_done(self) -> bool:
        """Count a pump out; True for the last one."""
        with self._lock:
            self._running -= 1
            return self._running == 0


class TcpProxy:
    """Forwards connections to `127.0.0.1:<port>` on to `target_host:target_port`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[_Pair] = set()
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._closed = threading.Event()
        self._spawn(self._accept_loop)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [known for known in self._threads if known.is_alive()]
            self._threads.append(thread)
        thread.start()

    def cut(self) -> None:
        """Break every open connection and refuse new ones until `restore()`."""
        with self._lock:
            self._cut = True
            pairs = list(self._pairs)
        for pair in pairs:
            pair.shut()

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed.set()
        self.cut()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=10)
        self._listener.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            with self._lock:
                refused = self._cut
            if refused:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            pair = _Pair(client, upstream)
            with self._lock:
                refused = self._cut
                if not refused:
                    self._pairs.add(pair)
            if refused:
                client.close()
                upstream.close()
                continue
            self._spawn(self._pump, pair, client, upstream)
            self._spawn(self._pump, pair, upstream, client)

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass  # shut down by cut(), or by the other side
        pair.shut()
        if pair.pump_done():
            with self._lock:
                self._pairs.discard(pair)
            pair.client.close()
            pair.upstream.close()
