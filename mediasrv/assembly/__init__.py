"""The composition root: where the rings are put together, above everything they join.

``stores`` builds the configured store backends, ``app`` the Tornado application and its
runtime from the route rows of ``handlers`` and the core services, ``openapi`` and
``for_agents`` the two documents derived from those rows. Only this package and ``mediasrv.cli``
(the processes) import both the transport's handlers and the concrete stores.
"""
