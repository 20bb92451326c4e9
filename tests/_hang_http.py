"""A JSON reply for the small HTTP servers of the hang test jobs (tests/_hang_waits_job.py,
tests/_hang_loops_job.py), which import it from their own directory; never a test module itself."""

import json
from http.server import BaseHTTPRequestHandler


def reply_json(handler: BaseHTTPRequestHandler, body: dict) -> None:
    data = json.dumps(body).encode()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
