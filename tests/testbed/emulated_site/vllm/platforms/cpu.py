"""EMULATED: vLLM's CpuPlatform, which pdboot's argument check selects before parsing."""


class CpuPlatform:
    device_type = "cpu"
