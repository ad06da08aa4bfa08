"""The link stage's real load: torch matmuls and copies on every GPU while NVML is polled.

worker.py runs in its own process (`python -m p2pkit.load.worker CONFIG_JSON`) so that torch
stays out of p2pkit's start-up and a hung GPU cannot hang p2pkit: it prints one JSON document.
"""
