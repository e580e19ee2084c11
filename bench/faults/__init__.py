"""The chaos bench's parts (`bench/chaos.py`): one server fault at a time, on the
three-node local cluster, during a nine o'clock burst."""
