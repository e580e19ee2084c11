"""The write-paths scenario: tasks written through every way a caller has, due from a
minute ago to seconds ahead, and cancels of tasks in every place they can be; shared by
`bench/write_paths.py` and the tests that hold it to its bounds."""
