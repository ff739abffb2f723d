"""EMULATED (see vllm/__init__.py)."""
