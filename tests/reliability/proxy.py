"""A TCP relay on loopback that can delay every byte, or lose them all, to play a slow or a
cut network to the API server or a lock store.

TLS passes through untouched: the API server's certificate has the IP SAN 127.0.0.1 and
the relay listens on 127.0.0.1, so clients verify it exactly as without the relay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any

CHUNK = 65536


class DelayingProxy:
    """Relay 127.0.0.1:<port> to a loopback upstream; `delay` seconds are added to every chunk.

    Order is kept per direction: a chunk read at t is written at t + delay (the delay in
    force when it was read), never before the chunk read ahead of it.
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        if upstream_host not in {"127.0.0.1", "localhost", "::1"}:
            raise ValueError(f"only loopback upstreams are relayed, not {upstream_host}")
        self.upstream = (upstream_host, upstream_port)
        self.delay = 0.0
        # A cut network: connections stay open, every byte either way is lost (as when a
        # firewall drops packets), until `cut` is False again.
        self.cut = False
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        server: asyncio.Server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if self._server is not None:
            server = self._server
            self._server = None
            self._call(self._close(server))
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> DelayingProxy:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _close(self, server: asyncio.AbstractServer) -> None:
        server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        except OSError:
            writer.close()
        except asyncio.CancelledError:
            # Our own shutdown: end quietly, the streams' done-callback must not see a cancel.
            writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()

        delivery = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                if data and self.cut:
                    continue  # lost on the way
                await queue.put((time.monotonic() + self.delay, data))
                if not data:
                    break
            await delivery
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            delivery.cancel()
            writer.close()
