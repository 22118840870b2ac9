"""The REST API: one module per endpoint, every view an ApiView (base.py), every error a
problem (problems.py, answered by handler.py), the OpenAPI kit in schema.py.

    route                                                  module       role
    -----------------------------------------------------  -----------  -------
    GET, POST      /api/v1/channels                        channels     admin
    GET, PATCH,    /api/v1/channels/{name}                 channel      admin
      DELETE
    POST           /api/v1/channels/{name}/events          produce      produce
    GET            /api/v1/channels/{name}/events          search       admin
                   (search newest first, or tail)
    GET            .../{name}/partitions/{p}/events        events       admin
    GET            .../{name}/partitions/{p}/batches       batches      consume
    POST           .../{name}/takes, takes/{id}/commit,    takes        consume
                   takes/{id}/rollback
    GET, POST      .../{name}/subscriptions,               subscriptions consume
    GET, DELETE    .../subscriptions/{sub},                             (reading),
    POST           .../subscriptions/{sub}/reset                        admin
    POST           .../{name}/losses/acknowledge           losses       admin
    POST           .../{name}/recreate (files missing)     storage      admin
    POST           .../{name}/exports                      exports      admin
    POST           .../{name}/kafka-runs                   kafka        admin
    GET            /api/v1/runs                            runs         admin
    GET            /metrics (Prometheus text)              metrics      admin

/health (appliance/views.py) is a plain Django view, open to all; the UI's pages are
appliance/ui.
"""
