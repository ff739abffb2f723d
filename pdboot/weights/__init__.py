"""Model weights: one commit, resolved once, staged once per engine host before any engine
starts (hub.py resolves, pin.py keeps a deployment on its commit, stage.py runs the real
huggingface_hub client on each host, local.py checks a local model path)."""
