"""TTFT/TPOT benchmarks of placements against llama.cpp's own on the same budget.

    harness   configurations, `oallama bench`, one fresh worker process per configuration
    worker    the process that loads, warms up and times one configuration
    report    JSON/CSV/Markdown/PNG from the raw records, and the README table
"""
