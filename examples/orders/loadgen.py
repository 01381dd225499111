"""The load generator: a reproducible stream of orders, sent to the gateway over HTTP.

    python -m examples.orders.loadgen --url http://127.0.0.1:8080/orders --orders 10000 --rate 2000

Orders come from `--seed` alone (the same seed, the same orders), in JSON batches of `--batch`, paced to
`--rate` orders a second (0: as fast as the gateway answers). A batch the gateway does not answer (it
is restarting) is sent again after a pause; one it refuses (400) stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Iterator

import msgspec

from .api import Order

SYMBOLS = ("AAPL", "MSFT", "GOOG")
ACCOUNTS = ("alice", "bob", "carol", "dave")


def orders(count: int, seed: int = 1) -> Iterator[Order]:
    """`count` orders around a fixed price per symbol, so that about half of them cross the book."""
    rnd = random.Random(seed)
    for n in range(count):
        symbol = rnd.choice(SYMBOLS)
        mid = 1000 * (1 + SYMBOLS.index(symbol))
        yield Order(f"o{seed}-{n}", rnd.choice(ACCOUNTS), symbol, rnd.choice(("buy", "sell")),
                    rnd.randint(1, 100), mid + rnd.randint(-5, 5))


async def send(url: str, count: int, *, seed: int = 1, batch: int = 50, rate: float = 0.0,
               retry_for: float = 30.0) -> int:
    """POST the orders; returns how many the gateway accepted."""
    import aiohttp

    encode = msgspec.json.encode
    stream = list(orders(count, seed))
    sent = 0
    began = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for at in range(0, len(stream), batch):
            body = encode(stream[at:at + batch])
            deadline = time.monotonic() + retry_for
            while True:
                try:
                    async with session.post(url, data=body,
                                            headers={"Content-Type": "application/json"}) as r:
                        if r.status == 400:
                            raise SystemExit(f"loadgen: refused: {await r.text()}")
                        r.raise_for_status()
                        sent += int((await r.json())["accepted"])
                        break
                except (TimeoutError, aiohttp.ClientConnectionError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            if rate:
                ahead = (at + batch) / rate - (time.monotonic() - began)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    return sent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m examples.orders.loadgen", description=__doc__)
    p.add_argument("--url", default="http://127.0.0.1:8080/orders")
    p.add_argument("--orders", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--rate", type=float, default=0.0, help="orders a second (0: unpaced)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    n = asyncio.run(send(args.url, args.orders, seed=args.seed, batch=args.batch, rate=args.rate))
    print(f"loadgen: {n} orders accepted in {time.monotonic() - t0:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
