"""`pdboot watch`'s shell: the loop (run.py), the command and its HTTP server (service.py), one
canary's requests (canary.py) and `status`'s read of the verdicts (verdicts.py). The decisions
are pdboot.plan.watch's."""
