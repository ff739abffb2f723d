"""EMULATED: not vLLM. The stand-in image's answer to pdboot's after-pull argument check
(pdboot/preflight/image_args.py): the parser of the stand-in engine, which holds exactly the
options of the real `vllm serve` release it plays (VLLM_STANDIN_VERSION; README.md here)."""

from vllm.entrypoints.cli.serve import standin as _standin

__version__ = _standin.VERSION
