"""The parts of the nine o'clock bench. `bench/nine_oclock.py` is its command line, and
its module docstring explains the whole bench and lists the modules here."""
