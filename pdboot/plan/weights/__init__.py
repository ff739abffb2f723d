"""Model weights, the pure part: one commit, resolved once, staged once per engine host before
any engine starts (hub.py: the hub's revision API and its answers; pin.py keeps a deployment on
its commit; engine_args.py: what the engines are told; progress.py: the staging container's
report; local.py: a local model path's completeness). The I/O is in pdboot.deploy.weights,
the hub request in pdboot.transport.hub."""
