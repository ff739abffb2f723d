"""`pdboot watch` as a service beside the router (the inventory's ``watch:`` with an ``image``).

The container runs ``pdboot watch`` on the inventory `up` ships beside compose.yaml (as YAML
written from the validated inventory: references to secrets, never their values), binds its
/metrics and /verdicts to the router host's address, and is restarted by Docker like the other
services. It cannot reach the other hosts over SSH, so there a restart is an alert (``--no-
restart``): run `pdboot watch` from the operator's machine for restarts.
"""

from __future__ import annotations

import yaml

from pdboot.inventory.rules import advertised_address
from pdboot.inventory.schema import Inventory
from pdboot.plan.model import WATCH_SECRETS_FILE, BindMount, Service, url_host

WATCH_INVENTORY = "watch-inventory.yaml"  # beside compose.yaml on the router host
WATCH_INVENTORY_IN_CONTAINER = "/etc/pdboot/inventory.yaml"


def watch_inventory_text(inv: Inventory) -> str:
    """What the operator wrote (unset fields stay unset), as YAML the service loads."""
    doc = inv.model_dump(mode="json", exclude_unset=True, by_alias=True)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def watch_secrets_text(api_key: str | None) -> str | None:
    """The watch service's env file: the engines' API key alone (None: no key)."""
    return f"VLLM_API_KEY={api_key}\n" if api_key else None


def watch_service(
    inv: Inventory, project: str, labels: tuple[tuple[str, str], ...]
) -> Service | None:
    """None unless the inventory asks for the service (``watch.image``)."""
    w = inv.watch
    if w is None or w.image is None:
        return None
    host = inv.router.host
    address = w.bind or advertised_address(inv.hosts[host])
    # the project dir on the host, as pdboot.transport.hosts.project_dir lays it out
    project_dir = f"{inv.remote_dir.rstrip('/')}/{inv.name}"
    return Service(
        name="watch",
        role="watch",
        host=host,
        address=address,
        port=w.port,
        project=project,
        image=w.image,
        command=(
            "watch",
            WATCH_INVENTORY_IN_CONTAINER,
            "--listen",
            f"{url_host(address)}:{w.port}",
            "--no-restart",
        ),
        entrypoint=("pdboot",),
        environment=(),
        gpus=None,
        rdma=False,
        restart=inv.container.restart,
        labels=labels,
        mounts=(
            BindMount(
                f"{project_dir}/{WATCH_INVENTORY}", WATCH_INVENTORY_IN_CONTAINER, read_only=True
            ),
        ),
        # only the API key the engines want (VLLM_API_KEY), never the rest of secrets.env
        # (the HF token): its own 0600 file
        env_file=WATCH_SECRETS_FILE if inv.secrets.api_key is not None else None,
    )
