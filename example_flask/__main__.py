"""``python -m example_flask``: serve the example on 127.0.0.1:5005 with
Flask's threaded development server. Use gunicorn in production:
``gunicorn -w 1 --threads 64 -b 127.0.0.1:5005 'example_flask:create_app()'``."""

import os

from . import create_app

if __name__ == "__main__":
    app = create_app()
    host = os.environ.get("HOST", "127.0.0.1")
    port = int(os.environ.get("PORT", "5005"))
    print(f" * backend: {app.config['STREAMER_BACKEND']}; try: curl -X POST {host}:{port}/stream -d 's=Happy birthday to you.'")
    app.run(host=host, port=port, threaded=True)
