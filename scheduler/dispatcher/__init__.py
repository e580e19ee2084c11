"""The dispatcher: shard leases, timing wheels, firing due tasks to the ready topics.

`balance` decides which shards a dispatcher holds, `shard` keeps one shard's firing
state (pure), and `runtime` runs the threads that do the I/O.
"""
