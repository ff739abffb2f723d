"""EMULATED: the attribute pdboot's argument check sets (vLLM's lazy current_platform)."""

current_platform = None
