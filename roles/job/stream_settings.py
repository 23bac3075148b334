"""``[stream]``: a job that learns from a broker's topic instead of passes over files
(docs/streams.md). Its rows' schema stays ``[data]``'s (label, dense, sparse, lists, timestamp).
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMATS = ("json", "tsv", "csv")   # a message's events: json objects or text lines


@dataclass(frozen=True)
class StreamLabelsConfig:
    """Labels that arrive later than their impressions, on a topic of their own."""

    topic: str = field(default="", metadata={"doc": (
        "the labels' subject or topic; empty: every event carries its label")})
    id_field: str = field(default="event_id", metadata={"doc": (
        "the field an impression and its label share")})
    window_s: float = field(default=600.0, metadata={"min": 0.001, "doc": (
        "seconds of event time an impression waits for its label before it is trained as a "
        "negative (and a label for its impression)")})


@dataclass(frozen=True)
class StreamConfig:
    url: str = field(default="", metadata={"doc": (
        "`nats://host:4222[,host:port...]` (NATS JetStream) or `kafka://host:9092[,...]` "
        "(Kafka); empty: no stream, the job reads `[data] path`")})
    topic: str = field(default="", metadata={"doc": (
        "the JetStream subject (its stream found by subject) or the Kafka topic")})
    format: str = field(default="json", metadata={"choices": FORMATS, "doc": (
        "`json`: one object per event keyed by column name, several a message one per line; "
        "`tsv`/`csv`: one line per event, its fields named by `columns`")})
    columns: list[str] = field(default_factory=list, metadata={"doc": (
        "a tsv/csv event's fields, in order")})
    group: str = field(default="", metadata={"doc": (
        "the durable consumer (NATS) or consumer group (Kafka); empty: the job's name")})
    start: str = field(default="earliest", metadata={"choices": ("earliest", "latest"), "doc": (
        "where a new group begins (a resumed run starts where its checkpoint says)")})
    linger_ms: float = field(default=50.0, metadata={"min": 0.0, "doc": (
        "a partial batch leaves once its oldest event has waited this long")})
    window_events: int = field(default=10_000, metadata={"min": 1, "doc": (
        "events in one window of progressive validation")})
    warmup_events: int = field(default=10_000, metadata={"min": 1, "doc": (
        "the first events whose dense statistics make the dense transform (each feeder's "
        "share; trained first)")})
    ack_wait_s: float = field(default=30.0, metadata={"min": 1.0, "doc": (
        "NATS: a message not acknowledged this long after its delivery is delivered again "
        "(JetStream's AckWait: how soon a dead feeder's messages come back; a feeder says the "
        "messages it holds are in progress every third of it). Kafka: how long a revoke (a "
        "rebalance) waits, holding up the group's rebalance, for the batches this feeder has "
        "begun of the revoked partitions to be trained and committed (what it has read and "
        "not begun is set aside for the next owner, which reads it from the commit); a dead "
        "feeder's partitions go to the others when its session ends")})
    options: dict[str, str] = field(default_factory=dict, metadata={"doc": (
        "the client's own settings, passed on as they are: NATS `user_credentials`, `token`, "
        "`user`, `password`, ...; librdkafka's `sasl.*`, `ssl.*`, `security.protocol`, ...")})
    labels: StreamLabelsConfig = field(default_factory=StreamLabelsConfig, metadata={"doc": (
        "labels joined as they arrive")})

    def __post_init__(self) -> None:
        if not self.url:
            return
        scheme, sep, hosts = self.url.partition("://")
        if scheme not in ("nats", "kafka") or not sep or not hosts:
            raise ValueError(f"[stream] url must be nats://host:port or kafka://host:port, got "
                             f"{self.url!r}")
        if not self.topic:
            raise ValueError("[stream] topic is required with [stream] url")
        if self.format != "json" and not self.columns:
            raise ValueError(f"[stream] format = \"{self.format}\" needs [stream] columns (the "
                             "fields of a line, in order)")
        if self.labels.topic == self.topic:
            raise ValueError("[stream.labels] topic must differ from [stream] topic")
