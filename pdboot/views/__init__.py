"""Views: turn the orchestrator's events (pdboot/events.py) into output. Only views (and
cli/) import rich; views/preflight.py is the preflight report."""
