"""The trainer (issue 12)."""
