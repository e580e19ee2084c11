"""`scheduler demo`: results day, played end to end on one machine.

    story.py    who submits what, and when (pure: the plan and what it should lead to)
    gateway.py  the fake SMS provider: a SQLite file that refuses to send a key twice
    app.py      the worker application the demo's workers run (`scheduler.demo.app:app`)
    fleet.py    the dispatcher and worker processes, their logs and stats files
    board.py    the live view: tasks per tenant and status, SMS sent, events
    outcome.py  the summary: delivered, lost, absorbed duplicates, lateness
    local.py    `--backend local`: a keyspace, topics and ZooKeeper root of its own
    play.py     the whole story, step by step
"""
