"""sinusoidal_2d family (being written)."""
