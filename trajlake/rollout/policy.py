"""The policy interface lives with the environment contract (``trajlake.envs.policy``), the bottom layer;
this module re-exports it for code written against its old place."""

from trajlake.envs.policy import (
    BYTE_TOKENIZER_ID,
    Policy,
    PolicyOutput,
    TaskView,
    byte_detokenize,
    byte_tokenize,
)

__all__ = ["BYTE_TOKENIZER_ID", "Policy", "PolicyOutput", "TaskView", "byte_detokenize", "byte_tokenize"]
