"""Quiet transformers' config warnings in the ONNX tests (tiny configs, unused keys)."""

from transformers.utils import logging

logging.set_verbosity_error()
