"""The orchestrator: up, down, status and logs, the waits and readiness probes they use, and the
seams (small interfaces) through which unit tests drive them with fake hosts."""
