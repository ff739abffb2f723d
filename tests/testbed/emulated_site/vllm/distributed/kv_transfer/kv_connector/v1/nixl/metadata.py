"""EMULATED: where vLLM 0.33/0.34 define NIXL_CONNECTOR_VERSION, a NIXL compatibility hash
input that pdboot's after-pull probe reads (pdboot/preflight/image_args.py)."""

from vllm.entrypoints.cli.serve import standin as _standin

NIXL_CONNECTOR_VERSION = _standin.CONNECTOR_VERSION
