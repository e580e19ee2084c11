"""`python -m scheduler` is the `scheduler` command."""

from scheduler.cli import main

main()
