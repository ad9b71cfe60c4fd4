"""The queue on Redis: key names, the Lua scripts that change a batch atomically,
the batch store, submit, control, status, results, metrics and the connection. No
model code: the engine is the worker's."""
