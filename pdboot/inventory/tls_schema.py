"""``router.tls``: the public endpoint over HTTPS (the proxy terminates TLS, plan/proxy.py).

The certificate chain and its key are references, like secrets ("env:NAME" or "file:/path"),
never PEM text in the inventory: `up` reads them on the operator's machine and ships them
beside compose.yaml on the router host, mode 0600; preflight checks that the key matches the
certificate and that the certificate is not expired (pdboot/preflight/checks/tls.py).
"""

from __future__ import annotations

from pydantic import field_validator

from pdboot.inventory.safety import check_reference
from pdboot.inventory.strict import Strict


class RouterTls(Strict):
    cert: str  # the server certificate, then any intermediates (PEM)
    key: str  # its private key (PEM, unencrypted: nginx starts without a passphrase)

    @field_validator("cert", "key")
    @classmethod
    def _ref(cls, v: str) -> str:
        return check_reference(v, bare_path=True)
