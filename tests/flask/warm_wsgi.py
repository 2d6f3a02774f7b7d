"""The warm-up app as a module-level WSGI app that loads its models as it
is imported, as example_flask/wsgi.py does (uWSGI with ``--lazy-apps``)."""

from flask_streamer import start_streamers
from tests.flask.warm_app import create_app

app = create_app()
start_streamers(app)
