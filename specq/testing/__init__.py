"""Helpers for specq's tests and scripts: toy GGUF models written with gguf's writer,
and the chaos harness that kills workers and Redis at random moments."""
