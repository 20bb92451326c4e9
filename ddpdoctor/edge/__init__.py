"""The edge where user-supplied input enters: the one bounded, regular-file-only reader and writer
(files.py) and the one redaction function family (redact.py).

Snapshot fact files are checked against the shape each fact declares with `define_fact` (sources.py,
json_shape.find_mismatch) as ReplaySources reads them. Everything here is I/O or text hygiene: no
judging, no printing.
"""
