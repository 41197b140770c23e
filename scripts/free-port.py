#!/usr/bin/env python3
# Prints a TCP port on 127.0.0.1 that nothing is bound to now, taken below Linux's ephemeral
# range (32768 up): a port handed out for port 0 comes from the range outgoing connections'
# local ports come from, and one of them can take it before the server binds it.
import random
import socket

for _ in range(100):
    port = random.randrange(20000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
