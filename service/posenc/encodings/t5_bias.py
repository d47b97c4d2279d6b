"""t5_bias family (being written)."""
