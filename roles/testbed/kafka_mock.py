"""Kafka for tests: librdkafka's mock cluster (``test.mock.num.brokers``), which speaks
Kafka's protocol on a loopback port to any client, in this process or another. It lives as
long as the producer that made it; topics are made on first use (4 partitions). It keeps a few
MB a partition: beyond, the oldest messages are dropped (``watermarks`` shows it)."""

from __future__ import annotations


class MockKafka:
    def __init__(self, brokers: int = 1):
        from confluent_kafka import Producer
        self._producer = Producer({"test.mock.num.brokers": brokers, "log_level": 3})
        found = self._producer.list_topics(timeout=10).brokers
        self.bootstrap = ",".join(f"{b.host}:{b.port}" for b in found.values())
        self.url = f"kafka://{self.bootstrap}"

    def produce(self, topic: str, payloads: list[bytes], partition: int = -1) -> None:
        for p in payloads:
            self._producer.produce(topic, p, partition=partition)
        if self._producer.flush(30) != 0:
            raise RuntimeError("the mock cluster did not take every message")

    def make_topic(self, topic: str) -> int:
        """``topic`` made now, empty (asked for by name, as a first use): its partitions."""
        return len(self._producer.list_topics(topic, timeout=10).topics[topic].partitions)

    def watermarks(self, topic: str, partitions: int = 4) -> list[tuple[int, int]]:
        """Each partition's (low, high) offsets: a low above 0 is messages the mock cluster
        dropped (it keeps a few MB a partition)."""
        from confluent_kafka import Consumer, TopicPartition
        asking = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "zbus-watermarks",
                           "log_level": 3})
        try:
            return [asking.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    for p in range(partitions)]
        finally:
            asking.close()

    def close(self) -> None:
        self._producer.flush(5)
        del self._producer
