"""Staging the model's weights on the engine hosts, the I/O: pin, one-shot staging and seed
containers and the programs they run, the HF cache directory checked (pdboot.plan.weights
holds the pure helpers; pdboot.deploy.stage is the `stage` verb)."""
