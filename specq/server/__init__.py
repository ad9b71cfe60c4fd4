"""`specq serve`: the OpenAI Batch API over the queue. A thin layer: uploaded files
are kept on disk, a batch created through the API is submitted with the queue's own
submit, read back with its status and results code, and paused, resumed or
cancelled with its control code; the workers are the usual `specq worker`s."""
