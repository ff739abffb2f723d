"""pdboot: stand up a disaggregated prefill/decode vLLM deployment over SSH and Docker."""

__version__ = "0.1.0"
