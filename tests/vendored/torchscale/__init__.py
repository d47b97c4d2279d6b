"""torchscale 0.3.0's xPos module, vendored byte for byte (see `tests.vendored`)."""
