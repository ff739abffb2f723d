"""Exit codes of every command, defined once."""

EXIT_OK = 0
EXIT_FAILED = 1  # a check or a deployment step failed
EXIT_USAGE = 2  # bad usage, inventory or secret reference
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT
EXIT_CHANGES = 2  # `up --plan --detailed-exitcode`: there are changes (terraform plan's code)
