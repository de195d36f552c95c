"""Tensor parallelism across weak hosts on top of oallama.collective (seed 001).

    decoder   a tensor-parallel llama decoder with All-Reduce+LayerNorm, `oallama tp`
    memory    weights from GGUF files, resident or streamed layer by layer
"""
