"""Exit codes of every command, defined once."""

EXIT_OK = 0
EXIT_FAILED = 1  # a check or a deployment step failed
EXIT_USAGE = 2  # bad usage, inventory or secret reference
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_CHANGES = 2  # `up --plan --detailed-exitcode`: there are changes (terraform plan's code)


def ended_in_words(code: int) -> str:
    """How a command ended, in words: a `done` event's summary when it has none better."""
    words = {
        EXIT_OK: "succeeded",
        EXIT_FAILED: "failed",
        EXIT_USAGE: "refused (bad usage, inventory or secret reference)",
        EXIT_INTERRUPTED: "interrupted",
    }
    return words.get(code, f"ended with exit code {code}")
