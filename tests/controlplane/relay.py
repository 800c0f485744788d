"""A TCP relay: accept on LISTEN_HOST:LISTEN_PORT, connect each client to TARGET_HOST:TARGET_PORT.

The real node (node.py) uses two: one for the kubelet and one for the pods, which reach
the API server (listening on 127.0.0.1 only) at the `kubernetes` Service's address.
TLS passes through untouched, so clients verify the API server's own certificate.
SIGSTOP on a relay cuts exactly its clients' path: connections open and then hang.

    python3 relay.py 203.0.113.1 443 127.0.0.1 43211
"""

from __future__ import annotations

import asyncio
import sys
import time


def stamp() -> str:
    return time.strftime("%H:%M:%S") + f".{int(time.time() * 1000) % 1000:03d}"


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def serve(listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        peer = client_w.get_extra_info("peername")
        try:
            server_r, server_w = await asyncio.open_connection(target_host, target_port)
        except OSError as error:
            print(f"{stamp()} {peer}: cannot connect: {error}", flush=True)
            client_w.close()
            return
        print(f"{stamp()} {peer}: open", flush=True)
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))
        print(f"{stamp()} {peer}: closed", flush=True)

    server = await asyncio.start_server(relay, listen_host, listen_port, reuse_address=True)
    print(f"relay {listen_host}:{listen_port} -> {target_host}:{target_port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, target, target_port = sys.argv[1:5]
    asyncio.run(serve(host, int(port), target, int(target_port)))
