"""TTFT/TPOT benchmarks of placements against llama.cpp's own on the same budget.

    harness   configurations, `oallama bench`, one fresh worker process per configuration
    worker    the process that loads, warms up and times one configuration
    report    JSON/CSV/Markdown/PNG from the raw records, and the README table
    accuracy  prediction error, measured winners, load and repeat checks of the records
    profiles  the profiles a run costs its plans with, saved beside its results (--reprofile)
"""
