"""Load, place, generate — knows no planner.

    devices    ggml devices (CPU, GPUs, rpc-servers) and `oallama devices`
    rpc        rpc-server processes (loopback or a namespace host) as devices
    place      a weight -> device map compiled into llama.cpp's buffer-type overrides
    planfile   plan files by schema, and the hook through which `Llama` asks for a plan
    llama      the drop-in `Llama` (llama-cpp-python's, plus devices/placement/readback)
    generate   timed generation (TTFT/TPOT) and `oallama run`
"""
