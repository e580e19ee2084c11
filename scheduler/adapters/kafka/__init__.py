"""The Kafka adapter: topics (`topics.py`), the ready-topic `Publisher` (`publisher.py`)
and the dispatchers' hand-off log (`handoff.py`), all on confluent-kafka (librdkafka).

Driver errors are translated here: `QueueUnavailable` when no broker answers within
`KafkaSettings.connect_timeout_s`, `QueueError` for anything Kafka refuses or loses,
`ConfigError` for topics that exist with a shape the scheduler cannot use.
"""
