"""`pdboot export`: the plan `render` lays out as compose files, laid out instead for a
scheduler (Kubernetes manifests, a Slurm batch script). Pure functions of the plan; the
CLI (pdboot/cli/export.py) only writes their files."""
