"""``python -m example_flask``: serve the example on 127.0.0.1:5005 with
Flask's threaded development server (``HOST`` and ``PORT`` change where).
Use gunicorn in production, with the example's settings (gevent workers,
the models loaded as each process boots: see that file):
``gunicorn -c example_flask/gunicorn.conf.py 'example_flask:create_app()'``."""

import os
import signal
import sys

from flask_streamer import start_streamers
from streamer_core.errors import ConfigurationError
from streamer_core.web.settling import freeze_after_loading

from . import create_app


def main() -> int:
    try:
        app = create_app()
        host = os.environ.get("HOST", "127.0.0.1")
        port = int(os.environ.get("PORT", "5005"))
        print(f" * backend: {app.config['STREAMER_BACKEND']}; loading the model before serving", flush=True)
        start_streamers(app)  # so that no request waits for it (and Redis refusing the URL is said here)
    except ConfigurationError as exc:
        for message in exc.messages or [str(exc)]:
            print(f"example_flask: error: {message}", file=sys.stderr)
        return 2
    # What loading made out of the collector's sight, as every server the
    # example runs under does: a collection does not stall requests, and
    # the interpreter's last collections at exit do not walk it for seconds.
    freeze_after_loading()
    print(f" * try: curl -X POST {host}:{port}/stream -d 's=Happy birthday to you.'", flush=True)
    print(f'   and: curl -F "file=@example_flask/cat.jpg" {host}:{port}/classify', flush=True)
    # SIGTERM (a service manager's stop, kill) ends the server as Ctrl-C
    # does: exit runs, the streamers close and the process backend's workers
    # and semaphores go with them, where the default handler would leave them
    # to the resource tracker ("leaked semaphore objects"). Django's
    # runserver does the same.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    app.run(host=host, port=port, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
