#!/usr/bin/env python3
# Prints a TCP port on 127.0.0.1 that nothing is bound to now and that no other test or
# benchmark process was handed in the last 10 minutes.
# - Taken below Linux's ephemeral range (32768 up): a port handed out for port 0 comes from the
#   range outgoing connections' local ports come from, and one of them can take it before the
#   server binds it.
# - Reserved by creating /tmp/idemgw-ports/PORT exclusively: processes picking at the same time
#   (test files run side by side) would otherwise be handed the same free port, and the second
#   server to bind it fails. tests/integration/lib/harness.mjs reserves the same way.
import os
import random
import socket
import time

DIR = "/tmp/idemgw-ports"
HOLD_SECONDS = 600


def reserve(port):
    path = os.path.join(DIR, str(port))
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        return True
    except FileExistsError:
        pass
    try:
        if time.time() - os.stat(path).st_mtime < HOLD_SECONDS:
            return False
        os.utime(path)  # an old reservation: taken over
        return True
    except FileNotFoundError:
        return False


os.makedirs(DIR, exist_ok=True)
try:
    os.chmod(DIR, 0o1777)  # shared by every user's test runs
except PermissionError:
    pass
for _ in range(200):
    port = random.randrange(20000, 32000)
    if not reserve(port):
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
else:
    raise SystemExit("free-port: no free TCP port between 20000 and 32000")
