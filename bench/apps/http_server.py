"""Serve ``bench.apps.http_app`` on 127.0.0.1 with one of the benchmark's servers.

    python -m bench.apps.http_server dev PORT              # Flask's dev server, app.run(threaded=True)
    python -m bench.apps.http_server gevent PORT           # gevent.pywsgi.WSGIServer, nothing patched
    python -m bench.apps.http_server gevent-patched PORT   # the same after gevent.monkey.patch_all()

(gunicorn is started by the benchmark itself: ``gunicorn -k gthread ...
'bench.apps.http_app:create_app()'``.) The app reads its model and settings from
the environment, see :mod:`bench.apps.http_app`. Request logging is off on every
server, so no server pays for writing a line per request.
"""

import sys

SERVERS = ("dev", "gevent", "gevent-patched")

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "gevent-patched":
    from gevent import monkey  # before anything imports threading, socket, time, ...

    monkey.patch_all()

import logging  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402


def main(argv: list) -> int:
    if len(argv) != 2 or argv[0] not in SERVERS:
        print(f"usage: python -m bench.apps.http_server {{{','.join(SERVERS)}}} PORT", file=sys.stderr)
        return 2
    server, port = argv[0], int(argv[1])
    os.environ["BENCH_HTTP_SERVER"] = server
    from bench.apps.http_app import create_app

    app = create_app()
    if server == "dev":
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        app.run(host="127.0.0.1", port=port, threaded=True, use_reloader=False)
    else:
        from gevent.pywsgi import WSGIServer

        server_class = WSGIServer
        if os.environ.get("BENCH_HTTP_NODELAY", "1") != "0":

            class NoDelayWSGIServer(WSGIServer):
                """pywsgi sends a response's headers and its body in two
                writes; with Nagle's algorithm on, the body waits for the
                client's delayed ACK of the headers (about 40 ms on Linux)
                on every keep-alive request. TCP_NODELAY sends it at once."""

                def handle(self, sock: socket.socket, address: tuple) -> None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    super().handle(sock, address)

            server_class = NoDelayWSGIServer
        server_class(("127.0.0.1", port), app, log=None).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
