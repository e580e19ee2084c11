"""The ZooKeeper adapter: membership and fenced shard leases (`coordinator.py`)."""
