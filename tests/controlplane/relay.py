"""A TCP relay: accept on LISTEN_HOST:LISTEN_PORT, connect each client to TARGET_HOST:TARGET_PORT.

The real node (node.py) uses two: one for the kubelet and one for the pods, which reach
the API server (listening on 127.0.0.1 only) at the `kubernetes` Service's address.
TLS passes through untouched, so clients verify the API server's own certificate.
SIGSTOP on a relay cuts exactly its clients' path: connections open and then hang.
Given several targets it balances: each connection goes to the next one in turn, and on to
the one after when a target refuses (a TCP balancer in front of an HA control plane,
controlplane.py's CRONLOCK_CONTROLPLANE_HA).

    python3 relay.py 203.0.113.1 443 127.0.0.1 43211 [127.0.0.1 43212 ...]
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


async def serve(listen_host: str, listen_port: int, targets: list[tuple[str, int]]) -> None:
    turn = 0

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        nonlocal turn
        peer = client_w.get_extra_info("peername")
        first, turn = turn, turn + 1
        for attempt in range(len(targets)):
            target_host, target_port = targets[(first + attempt) % len(targets)]
            try:
                server_r, server_w = await asyncio.open_connection(target_host, target_port)
                break
            except OSError as error:
                print(f"{stamp()} {peer}: cannot connect to {target_port}: {error}", flush=True)
        else:
            client_w.close()
            return
        print(f"{stamp()} {peer}: open to {target_port}", flush=True)
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))
        print(f"{stamp()} {peer}: closed", flush=True)

    server = await asyncio.start_server(relay, listen_host, listen_port, reuse_address=True)
    shown = ", ".join(f"{host}:{port}" for host, port in targets)
    print(f"relay {listen_host}:{listen_port} -> {shown}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, *rest = sys.argv[1:]
    pairs = [(rest[index], int(rest[index + 1])) for index in range(0, len(rest), 2)]
    asyncio.run(serve(host, int(port), pairs))
