"""Services you deploy: a services file (``services.yaml``) declares queues and the services between
them; `Runner` (``chronq services run``) starts and supervises them, `rpc.services.status` reports on
them (``chronq services status``), and on a replicated cluster a second host runs them in standby until
``chronq services promote``. See docs/services.md.
"""

from __future__ import annotations

from rpc.services.config import (
    QueueSpec,
    RunnerSpec,
    ServicesConfig,
    ServicesConfigError,
    ServiceSpec,
    Snapshot,
    load_services,
    parse_services,
)
from rpc.services.runner import Runner

__all__ = ["QueueSpec", "Runner", "RunnerSpec", "ServiceSpec", "ServicesConfig", "ServicesConfigError",
           "Snapshot", "load_services", "parse_services"]
