"""From a line of input to a generation request: input formats and their
validation, request ids, generation defaults, and a batch's configuration. Used alike
by local generation, the benchmark, training and the queue (no Redis here)."""
