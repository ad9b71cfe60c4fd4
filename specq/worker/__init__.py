"""A worker: the process and its supervisor, heartbeats and the reaper, the RQ job
function, the decode loop that claims, decodes and checkpoints a batch's requests,
and the circuit breaker and guarded proposer that keep a sick worker harmless."""
