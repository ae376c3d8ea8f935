"""The trainer (docs/training.md): ``math`` (pure losses, advantages, ratios), ``data`` (the lake as a torch
dataset), ``config`` (the experiment config) and ``loop`` (the stages B1/R1/R2/R3). Needs the ``lm`` extra
(torch, transformers); ``trajlake train --config FILE`` runs it."""
