"""Attention offload between models (seed 003: Weaver).

    host        the shared-memory task ring protocol and its CPU reference receiver/sender
    cpu         the CPU receiver: a cold model's llama.cpp decode serves tasks between its nodes
    cuda        the CUDA receiver (polling kernel), sender and IPC (opt-in build)
    splitting   the operator-splitting planner (expected wait behind a running kernel)
"""
