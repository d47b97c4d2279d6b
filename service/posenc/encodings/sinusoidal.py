"""sinusoidal family (being written)."""
