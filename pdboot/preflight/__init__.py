"""Preflight: run (contexts, fan-out, report), checks/ (one module per area), registry lookups,
the image probe after the pull, and the findings that outlive one run."""
