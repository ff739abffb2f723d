"""EMULATED: vLLM's ServeSubcommand over the stand-in engine's own `vllm serve` options
(/opt/vllm-standin/vllm_standin.py, or $VLLM_STANDIN_DIR for the unit tests)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.environ.get("VLLM_STANDIN_DIR", "/opt/vllm-standin"))
standin = importlib.import_module("vllm_standin")


class ServeSubcommand:
    name = "serve"

    def subparser_init(self, subparsers: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = subparsers.add_parser(
            self.name, usage="vllm serve [model_tag] [options]"
        )
        standin.add_serve_args(parser)
        return parser

    def validate(self, args: argparse.Namespace) -> None:
        """What the stand-in checks after parsing (vLLM does it while parsing the JSON)."""
        raw = getattr(args, "kv_transfer_config", None)
        if raw is None:
            return
        try:
            cfg = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError:
            raise ValueError(f"argument --kv-transfer-config: Value {raw} is not JSON") from None
        errs = standin.validate_kv(cfg) if isinstance(cfg, dict) else ["expected a JSON object"]
        if errs:
            raise ValueError(
                f"argument --kv-transfer-config: {len(errs)} validation error"
                f"{'s' if len(errs) > 1 else ''} for KVTransferConfig\n" + "\n".join(errs)
            )
