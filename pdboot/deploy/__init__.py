"""The orchestrator: up, down, status and logs, the waits and readiness probes they use, and the
factories (frame.py: hosts and lock; preflight_gate.py: preflight) through which unit tests
drive them with fake hosts."""
