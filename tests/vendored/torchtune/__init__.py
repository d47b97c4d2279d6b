"""torchtune 0.6.1's two rotary modules, vendored byte for byte (see `tests.vendored`)."""
