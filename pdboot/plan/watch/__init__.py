"""`pdboot watch`'s pure core: its decisions (policy.py), its events and metrics, the verdicts
`status` reads, and watch as a service beside the router (sidecar.py). The shell (the loop, the
service, the canary's requests) is pdboot.deploy.watch."""
