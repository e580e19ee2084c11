"""The Cassandra adapter: connection, schema, and (later) the task store."""
