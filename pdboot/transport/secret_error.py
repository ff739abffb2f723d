"""The one error a secret reference raises when it cannot be resolved (exit 2): its own module
so that what only reads secrets (preflight's TLS check) does not import the Docker SDK with
transport/hosts.py."""


class SecretError(Exception):
    """A secret reference in the inventory cannot be resolved (exit 2)."""
