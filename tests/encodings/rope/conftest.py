"""Quiet transformers' config warnings (unused keys, tiny vocabularies) in the RoPE tests."""

from transformers.utils import logging

logging.set_verbosity_error()
