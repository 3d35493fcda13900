"""The witness checks' names, in the order they run: one list for `witness --only` (witness/checks.py) and
a site's `trust.require_witnessed` (plan/site.py), which is validated before any witness module loads."""

CHECKS = ("python", "imports", "cli", "weights", "kernel", "collectives", "dtensor", "docs")
