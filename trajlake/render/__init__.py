"""Rendering of language-model turns (io layer): chat-template pieces and the tokenizer fingerprint
(``chat``), the Hermes tool-call format (``toolcall``) and token-exactness checks of stored episodes
(``exactness``). Policy-free: the rollout's LM policies and the trainer's reader both build on it."""
