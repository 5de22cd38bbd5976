"""Python client of the sessionhub WebSocket hub.

The client speaks the wire protocol defined in :mod:`protocol`; it lands together with the
hub's ``/ws`` endpoint (see ``docs/`` and the issue tracker for its status).
"""

__all__: list[str] = []
