"""The edge where user-supplied input enters: the one bounded, regular-file-only reader and writer
(files.py), the one redaction function family (redact.py) and the one /proc/PID/stat reader (procfs.py).

Snapshot fact files are checked against the shape each fact declares with `define_fact` (sources.py,
json_shape.find_mismatch) as ReplaySources reads them. Everything here is I/O or text hygiene: no
judging, no printing.
"""
