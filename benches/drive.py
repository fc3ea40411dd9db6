#!/usr/bin/env python3
"""Send N requests, one after another, on one keep-alive connection (benches/compare.sh).

    drive.py HOST PORT N PATH [HEADER] [EXPECT]

HEADER is one extra request header line ("X-API-Key: ..."), EXPECT "200" or "429": at most
one response may differ from it (the first request of a 429 scenario is admitted).
Prints the status counts; exits 1 when the expectation fails or the connection closes.
"""
import socket
import sys

host, port, n, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
extra = (sys.argv[5] + "\r\n") if len(sys.argv) > 5 and sys.argv[5] else ""
expect = sys.argv[6].encode() if len(sys.argv) > 6 else None
# Generous: under callgrind a request takes milliseconds, the first one far more.
s = socket.create_connection((host, port), timeout=120)
req = f"GET {path} HTTP/1.1\r\nHost: api.example.com\r\n{extra}\r\n".encode()
buf = b""
statuses = {}


def fill(cond):
    global buf
    while not cond():
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            sys.exit(f"drive: no response within 120 s after {sum(statuses.values())} responses")
        if not chunk:
            sys.exit(f"drive: connection closed after {sum(statuses.values())} responses")
        buf += chunk


for _ in range(n):
    s.sendall(req)
    fill(lambda: b"\r\n\r\n" in buf)
    head, buf = buf.split(b"\r\n\r\n", 1)
    status = head.split(b" ")[1]
    statuses[status] = statuses.get(status, 0) + 1
    cl, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            cl = int(value)
        elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            fill(lambda: b"\r\n" in buf)
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:  # no trailers expected: the last chunk ends with an empty line
                fill(lambda: len(buf) >= 2)
                buf = buf[2:]
                break
            fill(lambda: len(buf) >= size + 2)
            buf = buf[size + 2 :]
    else:
        fill(lambda: len(buf) >= cl)
        buf = buf[cl:]
s.close()
print(" ".join(f"{k.decode()}:{v}" for k, v in sorted(statuses.items())))
if expect is not None and statuses.get(expect, 0) < n - 1:
    sys.exit(f"drive: expected {expect.decode()} for every request, got {statuses}")
