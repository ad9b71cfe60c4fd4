"""`specq serve`: the OpenAI Batch API over the queue. A thin layer: uploaded files
are kept on disk, a batch created through the API is submitted with the queue's own
submit, read back with its status and results code, and paused, resumed or
cancelled with its control code; the workers are the usual `specq worker`s."""

# Synchronous requests a server follows at once by default; more get a 429 (each
# holds a connection, a task and reads of Redis, and the workers serve them a decode
# group at a time anyway). Here, so that the command line states it without
# importing the web stack.
MAX_SYNC_REQUESTS = 256
