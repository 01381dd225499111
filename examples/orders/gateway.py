"""The gateway: accepts JSON orders over HTTP (aiohttp) and writes each as an `OrderEntry.new_order` call.

    POST /orders   {"order_id": "o1", "account": "alice", "symbol": "AAPL", "side": "buy",
                    "quantity": 10, "price": 1500}          (or a JSON array of such orders)
    -> 202 {"accepted": 1}       400 {"error": "..."} for a body that is not orders (nothing written)
    GET /health    -> 200 {"written": N}

A source service (no input queue): the runner calls `run(stop)`, which serves until `stop` is set and
lets the request in hand finish. Each request's orders are written in one `atomic()` block, so a batch is
on the queue whole or not at all.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import msgspec
from aiohttp import web

import rpc
from chronq.durable import write_file

from .api import Order, OrderEntry

_decode = msgspec.json.Decoder(Order | list[Order]).decode


class Gateway:
    def __init__(self, output: object, host: str, port: int, port_file: str | None) -> None:
        self.output = output
        self.orders = rpc.writer(output, OrderEntry)
        self.host, self.port, self.port_file = host, port, port_file
        self.written = 0

    async def post_orders(self, request: web.Request) -> web.Response:
        try:
            got = _decode(await request.read())
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            return web.json_response({"error": str(e)}, status=400)
        orders = got if isinstance(got, list) else [got]
        atomic = getattr(self.output, "atomic", None)
        if atomic is not None:
            with atomic():
                for order in orders:
                    self.orders.new_order(order)
        else:
            for order in orders:
                self.orders.new_order(order)
        self.written += len(orders)
        return web.json_response({"accepted": len(orders)}, status=202)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"written": self.written})

    async def serve(self, stop: threading.Event) -> None:
        app = web.Application()
        app.add_routes([web.post("/orders", self.post_orders), web.get("/health", self.health)])
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        port = runner.addresses[0][1]  # the port bound (the one asked for, or a free one for 0)
        if self.port_file:
            write_file(Path(self.port_file), f"{port}\n".encode())
        try:
            while not stop.is_set():
                await asyncio.sleep(0.05)
        finally:
            await runner.cleanup()

    def run(self, stop: threading.Event) -> None:
        asyncio.run(self.serve(stop))


def make_gateway(output: object, host: str = "127.0.0.1", port: int = 8080,
                 port_file: str | None = None) -> Gateway:
    """The services file's factory: listen on `host`:`port` (0: any free port, written to `port_file`)."""
    return Gateway(output, host, port, port_file)
