"""The edge where user-supplied input enters: bounded file reading (files.py), the one redaction
function (redact.py) and the documented shape of every snapshot fact file (shapes.py).

Everything here is I/O or text hygiene: no judging, no printing.
"""
