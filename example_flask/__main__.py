"""``python -m example_flask``: serve the example on 127.0.0.1:5005 with
Flask's threaded development server (``HOST`` and ``PORT`` change where).
Use gunicorn in production:
``gunicorn -w 1 --threads 64 -b 127.0.0.1:5005 'example_flask:create_app()'``."""

import os
import sys

from flask_streamer import start_streamers
from streamer_core.errors import ConfigurationError

from . import create_app


def main() -> int:
    try:
        app = create_app()
    except ConfigurationError as exc:
        for message in exc.messages or [str(exc)]:
            print(f"example_flask: error: {message}", file=sys.stderr)
        return 2
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "5005"))
    print(f" * backend: {app.config['STREAMER_BACKEND']}; loading the model before serving", flush=True)
    start_streamers(app)  # so that no request waits for it
    print(f" * try: curl -X POST {host}:{port}/stream -d 's=Happy birthday to you.'", flush=True)
    print(f'   and: curl -F "file=@example_flask/cat.jpg" {host}:{port}/classify', flush=True)
    app.run(host=host, port=port, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
