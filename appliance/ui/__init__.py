"""The admin UI: server-rendered pages for operators (Django templates in templates/ui/,
assets in appliance/static/weir/, no CDN). Every page needs a staff login; every action
is a POST with CSRF. No template holds inline script, event handlers or style: the
Content-Security-Policy (appliance/csp.py) allows script from those files only.

    page / action                       module      what
    ----------------------------------  ----------  --------------------------------------
    /login/, /logout/                   urls        Django's auth views
    /                                   pages       dashboard: every channel's figures
    /channels/new                       pages       create a channel (the settings form)
    /channels/<name>/                   pages       settings, partitions, segments,
                                                    checkpoint, flush, retention, task
                                                    runs, exports, tokens
    /channels/<name>/events             browser     latest events and search across
                                                    partitions; a partition by offset/time
    /channels/<name>/events/tail        browser     the live tail's new rows (polled)
    /channels/<name>/events/step        browser     one short step of a search the page runs
    /channels/<name>/produce            produce_form  produce a test event (POST)
    /channels/<name>/events/<p>/<o>     browser     one event's raw body (download)
    /channels/<name>/<action>           actions     checkpoint, flush, retention, export,
                                                    pause, resume, verify, tokens, delete
    /ui/status, /channels/<name>/status pages       the parts that refresh themselves
"""
