"""A scoring service started by tests/_hang_waits_job.py's `length_header` scenario (never imported): it reads
a 4-byte length header and then that many bytes of request. It reads the header little-endian while the
client packs it big-endian (`!I`), so a 27-byte request reads as a length of 452,984,832 bytes: the service
waits for the rest of a request that was never that long, and the client waits for its reply."""

import socket
import struct
import sys

HEADER = struct.Struct("<I")


def recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(min(65536, n - len(buf)))  # HANG-LINE server-recv
        if not chunk:
            raise ConnectionError("client went away")
        buf += chunk
    return buf


def main(port: int) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        print("ready", flush=True)
        conn, _ = server.accept()
        with conn:
            while True:
                (n,) = HEADER.unpack(recv_exact(conn, HEADER.size))
                request = recv_exact(conn, n)
                reply = str(len(request)).encode()
                conn.sendall(HEADER.pack(len(reply)) + reply)


if __name__ == "__main__":
    main(int(sys.argv[1]))
