"""Language-neutral table definitions (JSON): the single source of truth for trajlake schemas."""
