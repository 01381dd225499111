"""The reference application of `chronq services`: an order-entry pipeline of three services.

    HTTP (JSON orders) -> gateway -> orders -> matching -> fills -> positions -> positions

declared in `services.yaml` and run by ``chronq services run examples/orders/services.yaml`` (see
docs/services.md): `gateway` accepts orders over HTTP (aiohttp) and writes them as `OrderEntry.new_order`
calls, `matching` keeps an order book per symbol and answers every order with one `order_result`
(accepted with its fills, or rejected), `positions` keeps each account's position and answers every
order that filled with one `positions_changed` (with the breaches of the account limit).
`loadgen` sends orders; `cluster.yaml` with `standby.yaml` is the two-host standby set-up.
"""
