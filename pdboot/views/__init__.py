"""Views: turn the orchestrator's events (pdboot/events.py) into output. Only views (and
cli.py, report.py) import rich."""
