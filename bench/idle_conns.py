#!/usr/bin/env python3
"""Opens N keep-alive client connections to a proxy, sends one request on each
(so every connection has been through a whole exchange, as a browser's would),
then, with all of them still open and idle, prints the proxy process's VmRSS.

Usage: idle_conns.py [--tls] HOST PORT PATH COUNT PID[,PID...]
With --tls each connection is TLS (handshake first, the certificate not checked: the
measurement is the server's memory). With several pids (nginx's master and workers) their
VmRSS and VmHWM are summed.
Prints: "<connections> <VmRSS kB> <VmHWM kB>" on success; exits 1 with a message otherwise.
"""

import selectors
import socket
import ssl
import sys
import time


def status_kb(pids, field):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    total += int(line.split()[1])
                    break
            else:
                raise RuntimeError(f"no {field} for pid {pid}")
    return total


def connect(host, port, tls):
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is not None:
        s = tls.wrap_socket(s, server_hostname="localhost")
    return s


def main():
    args = sys.argv[1:]
    tls = None
    if args and args[0] == "--tls":
        args = args[1:]
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        tls.set_alpn_protocols(["http/1.1"])
    host, port, path, count = args[0], int(args[1]), args[2], int(args[3])
    pid = [int(p) for p in args[4].split(",") if p]
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
            s = connect(host, port, tls)
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
            try:
                chunk = s.recv(65536)
            except ssl.SSLWantReadError:
                continue
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
            # A closed connection reads EOF (b""); an open idle one would block. (The TCP
            # socket under a TLS one: TLS sockets do not peek.)
            raw = socket.socket(fileno=s.fileno()) if tls is not None else s
            try:
                if raw.recv(1, socket.MSG_PEEK) == b"":
                    continue
            finally:
                if raw is not s:
                    raw.detach()
        except BlockingIOError:
            pass
        alive += 1
    print(alive, status_kb(pid, "VmRSS"), status_kb(pid, "VmHWM"))
    for s in socks:
        s.close()


if __name__ == "__main__":
    main()
