"""Is the P/D deployment right: engine metrics, the KV proof, the correctness gate and speed,
diagnosis of known failures in logs, and where an engine is in its start-up."""
