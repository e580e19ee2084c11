"""The status page: `scheduler ui`, and the page `scheduler demo` shows while it plays.

    views.py    what the page shows, as plain values, from a `Status` (no web code)
    charts.py   the per-minute charts, drawn as SVG on the server
    source.py   the backend the page reads and acts on, opened once, read at most every 2 s
    page.py     the Flask application: routes, templates, the replay and cancel actions
    letters.py  the names the page gives dead letters, which say nothing of other tenants
    access.py   who is looking: the login, the session, what a tenant's login may see and do
    credentials.py  the credentials file: names, scopes, hashed secrets
    serving.py  a waitress server for it in a thread of the calling process

The page has no build step and loads nothing from the network: HTML from Jinja
templates, an SVG per chart, one stylesheet and one small script (live refresh) served
from the package.
"""
