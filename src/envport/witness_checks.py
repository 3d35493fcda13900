"""The witness checks, in the order they run (a light module: the CLI's --help lists them)."""

CHECKS = ("python", "imports", "cli", "kernel", "collectives", "dtensor")
