"""alibi family (being written)."""
