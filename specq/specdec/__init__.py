"""The speculative decoding engine: numpy, gguf and tokenizers only.

Nothing in this package may import redis, rq or click: it is usable and testable
on its own, and the queue and CLI layers are thin shells around it.
"""

from specq.specdec import kernel_cache

kernel_cache.on_import()
