r"""The example as a module-level WSGI app, for servers that do not call an
app factory (uWSGI)::

    uwsgi --http 127.0.0.1:5005 --module example_flask.wsgi:app --master \
        --processes 1 --threads 64 --lazy-apps --die-on-term

It loads the model as it is imported: with ``--lazy-apps``, each uWSGI
worker imports it after the fork, so each loads its own copy before it
serves. (Without ``--lazy-apps`` the master would import it before forking,
loading a copy that no worker can use.)
"""

from flask_streamer import start_streamers

from . import create_app

app = create_app()
start_streamers(app)
