"""specq: resumable batch text generation with speculative decoding."""

__version__ = "0.1.0"
