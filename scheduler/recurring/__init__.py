"""Recurring schedules: a cron expression in an IANA time zone, a task template and a
misfire policy, stored once; the owner of the schedule's shard creates each run as an
ordinary task whose id follows from `(schedule, slot)`.

Pure modules (no drivers): `cron` (slots of a cron in a zone, the DST rules),
`schedule` (the `Schedule` value and its checks), `misfire` (which runs to create after
an outage), `jitter` (a deterministic offset per slot), `preview` (fire times for
people), and `runner` (one creation pass over a shard, through the ports).
"""
