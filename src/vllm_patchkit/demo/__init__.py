"""Local end-to-end demo pieces: a tiny offline model and a vLLM server harness.

Why: the machine has no hub access and no accelerator, so real serving needs a
model we can build on the spot and a harness that never leaves processes behind.
"""
