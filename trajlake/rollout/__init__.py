"""Rollouts: the policy interface, scripted policies' tokenizer, fault injection, and the runner that writes to
the lake (local processes or Ray)."""
