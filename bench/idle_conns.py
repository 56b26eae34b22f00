#!/usr/bin/env python3
"""Opens N keep-alive client connections to a proxy, sends one request on each
(so every connection has been through a whole exchange, as a browser's would),
then, with all of them still open and idle, prints the proxy process's VmRSS.

Usage: idle_conns.py HOST PORT PATH COUNT PID
Prints: "<connections> <VmRSS kB> <VmHWM kB>" on success; exits 1 with a message otherwise.
"""

import selectors
import socket
import sys
import time


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def main():
    host, port, path, count, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    pending = {}
    socks = []
    batch = 200  # connections in flight at once, so the proxy's accept queue never overflows
    opened = 0
    done = 0
    deadline = time.monotonic() + 120
    while done < count:
        while opened < count and len(pending) < batch:
            s = socket.create_connection((host, port))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(request)
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            pending[s] = b""
            socks.append(s)
            opened += 1
        if time.monotonic() > deadline:
            sys.exit(f"timed out: {done} of {count} connections answered")
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            chunk = s.recv(65536)
            if not chunk:
                sys.exit("the proxy closed a connection before answering")
            buf = pending[s] + chunk
            head, sep, body = buf.partition(b"\r\n\r\n")
            if not sep:
                pending[s] = buf
                continue
            status = head.split(b" ", 2)[1]
            if status != b"200":
                sys.exit(f"answer {status.decode()} instead of 200")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(body) < length:
                pending[s] = buf
                continue
            sel.unregister(s)
            del pending[s]
            done += 1
    # Every connection is now idle and kept alive; give the proxy a moment to settle its buffers.
    time.sleep(1)
    alive = 0
    for s in socks:
        try:
            # A closed connection reads EOF (b""); an open idle one would block.
            if s.recv(1, socket.MSG_PEEK) == b"":
                continue
        except BlockingIOError:
            pass
        alive += 1
    print(alive, status_kb(pid, "VmRSS"), status_kb(pid, "VmHWM"))
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
