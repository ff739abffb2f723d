"""Which container-start failures `up` retries once (pure)."""

from pdboot.transport.docker_host import is_transient_runtime_error

# As dockerd 20.10 / runc reported it on a loaded testbed host during `docker compose up`.
RUNC_NO_CAUSE = (
    "Error response from daemon: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: "
    "%!w(<nil>): unknown"
)
# Real causes that a retry cannot fix.
NO_HOOK = (
    'Error response from daemon: could not select device driver "nvidia" with capabilities: [[gpu]]'
)
BAD_MOUNT = (
    "Error response from daemon: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: "
    'error mounting "/dev/infiniband" to rootfs at "/dev/infiniband": no such file'
)


def test_runc_failure_without_a_cause_is_retried() -> None:
    assert is_transient_runtime_error(RUNC_NO_CAUSE)


def test_failures_with_a_cause_are_not() -> None:
    assert not is_transient_runtime_error(NO_HOOK)
    assert not is_transient_runtime_error(BAD_MOUNT)
    assert not is_transient_runtime_error("")
