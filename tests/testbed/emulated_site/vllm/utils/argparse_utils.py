"""EMULATED: vLLM's FlexibleArgumentParser is the stand-in's parser (its errors are shaped
like vLLM's: "vllm: error: unrecognized arguments: ...", exit 2)."""

from vllm.entrypoints.cli.serve import standin as _standin

FlexibleArgumentParser = _standin.Parser
