"""The live-server app as a module-level WSGI callable, for servers that do
not call an app factory (uWSGI: ``--module tests.flask.servers_wsgi:application``)."""

from tests.flask.servers_app import create_app

application = create_app()
