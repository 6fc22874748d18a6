"""Random OTLP export requests that reach every part of the event layout
(tests/support/otlp.py) and of the wire: every field, presence and oneof
member, values nested to and past the depth limit, non-finite doubles,
bytes, unicode, empty groups, ids of wrong lengths.  Used by the decoder's
differential fuzz test and by the layout's round-trip test."""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    EntityRef,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Exemplar,
    ExponentialHistogramDataPoint,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    SummaryDataPoint,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from storage_c.otlp import MAX_DEPTH
from tests.support import otlp as reference

ALPHABET = ["a", "b", "z", "0", " ", "~", "/", "~1", '"', "\\", "\n", "\t", "\x00", "\x1f",
            "\x7f", "é", "€", "😀", "\u2028", "service.name"]
KEYS = ["service.name", "host.name", "k", "a/b", "~", "", "é", "x"]
DOUBLES = [0.0, -0.0, 1.0, -2.5, 0.1, 1e-320, 5e-324, 1.7976931348623157e308, 2.0**53,
           2.0**53 + 2, 1e15, 1e16, 123456789.123456789, math.nan, math.inf, -math.inf]
INT64S = [0, 1, -1, 2**63 - 1, -2**63, 200, -(2**31)]
UINT64S = [0, 1, 2**64 - 1, 2**63, 1700000000000000000]
INT32S = [0, 1, 9, 24, -1, 2**31 - 1, -2**31]


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def chance(self, p: float) -> bool:
        return self.r.random() < p

    def text(self) -> str:
        return "".join(self.r.choice(ALPHABET) for _ in range(self.r.randrange(0, 5)))

    def key(self) -> str:
        return self.r.choice(KEYS) if self.chance(0.6) else self.text()

    def double(self) -> float:
        if self.chance(0.5):
            return self.r.choice(DOUBLES)
        x = self.r.uniform(-1, 1) * 10.0 ** self.r.randrange(-30, 30)
        return float(round(x)) if self.chance(0.2) else x

    def int64(self) -> int:
        return self.r.choice(INT64S) if self.chance(0.5) else self.r.randrange(-2**63, 2**63)

    def uint64(self) -> int:
        return self.r.choice(UINT64S) if self.chance(0.5) else self.r.randrange(0, 2**64)

    def uint32(self) -> int:
        return self.r.choice([0, 0, 1, 2**32 - 1, self.r.randrange(0, 2**32)])

    def int32(self) -> int:
        return self.r.choice(INT32S)

    def id(self, size: int) -> bytes:
        n = self.r.choice([size] * 12 + [0] * 4 + [size - 1, size + 1])
        return self.r.randbytes(n)

    def value(self, depth: int = 0) -> AnyValue:
        v = AnyValue()
        kind = self.r.randrange(10 if depth < 3 else 8)
        if kind == 0:
            pass  # unset
        elif kind == 1:
            v.string_value = self.text()
        elif kind == 2:
            v.bool_value = self.chance(0.5)
        elif kind == 3:
            v.int_value = self.int64()
        elif kind == 4:
            v.double_value = self.double()
        elif kind == 5:
            v.bytes_value = self.r.randbytes(self.r.randrange(0, 6))
        elif kind == 6:
            v.string_value_strindex = self.r.randrange(0, 3) if self.chance(0.05) else 0
            if not self.chance(0.05):
                v.string_value = self.text()
        elif kind == 7:
            v.array_value.SetInParent()  # empty
        elif kind == 8:
            v.array_value.values.extend(self.value(depth + 1) for _ in range(self.r.randrange(0, 4)))
        else:
            v.kvlist_value.values.extend(self.attributes(depth + 1))
        return v

    def deep(self, target: AnyValue, levels: int) -> None:
        """Makes target a value nested exactly `levels` arrays and maps deep
        (built in place: protobuf copies a message by parsing it, which has
        its own depth limit)."""
        for _ in range(levels):
            if self.chance(0.6):
                target = target.array_value.values.add()
            else:
                target = target.kvlist_value.values.add(key=self.key()).value
        if self.chance(0.3):
            target.array_value.SetInParent()  # an empty container at the bottom
        elif self.chance(0.7):
            target.CopyFrom(self.value(5))

    def attributes(self, depth: int = 0) -> list[KeyValue]:
        out = []
        for _ in range(self.r.randrange(0, 4 if depth < 2 else 2)):
            kv = KeyValue(key=self.key())
            if self.chance(0.9):
                if depth == 0 and self.chance(0.04):
                    self.deep(kv.value, self.r.choice([MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1,
                                                       MAX_DEPTH + 2]))
                else:
                    kv.value.CopyFrom(self.value(depth))
            if self.chance(0.02):
                kv.key_strindex = self.r.choice([1, -1])
            out.append(kv)
        return out

    def resource(self) -> Resource:
        res = Resource(attributes=self.attributes(),
                       dropped_attributes_count=self.uint32() if self.chance(0.3) else 0)
        if self.chance(0.5):
            kv = KeyValue(key="service.name")
            if self.chance(0.8):
                kv.value.string_value = self.text()
            else:
                kv.value.int_value = 7
            res.attributes.insert(self.r.randrange(0, len(res.attributes) + 1), kv)
        for _ in range(self.r.choice([0, 0, 1, 2])):
            res.entity_refs.append(EntityRef(schema_url=self.text(), type=self.text(),
                                             id_keys=[self.text() for _ in range(self.r.randrange(3))],
                                             description_keys=[self.text()
                                                               for _ in range(self.r.randrange(3))]))
        return res

    def scope(self) -> InstrumentationScope:
        return InstrumentationScope(name=self.text(), version=self.text(), attributes=self.attributes(),
                                    dropped_attributes_count=self.uint32() if self.chance(0.3) else 0)

    def log_record(self) -> LogRecord:
        rec = LogRecord(time_unix_nano=self.uint64(), observed_time_unix_nano=self.uint64(),
                        severity_number=self.int32(), severity_text=self.text(),  # type: ignore[arg-type]
                        attributes=self.attributes(),
                        dropped_attributes_count=self.uint32() if self.chance(0.3) else 0,
                        flags=self.uint32(), trace_id=self.id(16), span_id=self.id(8),
                        event_name=self.text())
        if self.chance(0.03):
            self.deep(rec.body, self.r.choice([MAX_DEPTH, MAX_DEPTH + 1]))
        elif self.chance(0.8):
            rec.body.CopyFrom(self.value())
        return rec

    def span(self) -> Span:
        sp = Span(trace_id=self.id(16), span_id=self.id(8), trace_state=self.text(),
                  parent_span_id=self.id(8), flags=self.uint32(), name=self.text(),
                  kind=self.int32(),  # type: ignore[arg-type]
                  start_time_unix_nano=self.uint64(), end_time_unix_nano=self.uint64(),
                  attributes=self.attributes(),
                  dropped_attributes_count=self.uint32() if self.chance(0.3) else 0,
                  dropped_events_count=self.uint32() if self.chance(0.3) else 0,
                  dropped_links_count=self.uint32() if self.chance(0.3) else 0)
        for _ in range(self.r.randrange(3)):
            sp.events.append(Span.Event(time_unix_nano=self.uint64(), name=self.text(),
                                        attributes=self.attributes(),
                                        dropped_attributes_count=self.uint32() if self.chance(0.3) else 0))
        for _ in range(self.r.randrange(3)):
            sp.links.append(Span.Link(trace_id=self.id(16), span_id=self.id(8), trace_state=self.text(),
                                      attributes=self.attributes(),
                                      dropped_attributes_count=self.uint32() if self.chance(0.3) else 0,
                                      flags=self.uint32()))
        if self.chance(0.7):
            sp.status.CopyFrom(Status(code=self.int32(), message=self.text()))  # type: ignore[arg-type]
        return sp

    def exemplars(self) -> list[Exemplar]:
        out = []
        for _ in range(self.r.choice([0, 0, 1, 2])):
            ex = Exemplar(filtered_attributes=self.attributes(), time_unix_nano=self.uint64(),
                          span_id=self.id(8), trace_id=self.id(16))
            self.number(ex)
            out.append(ex)
        return out

    def number(self, point: NumberDataPoint | Exemplar) -> None:
        which = self.r.randrange(3)
        if which == 1:
            point.as_int = self.int64()
        elif which == 2:
            point.as_double = self.double()

    def point_common(self) -> dict[str, Any]:
        return {"attributes": self.attributes(), "start_time_unix_nano": self.uint64(),
                "time_unix_nano": self.uint64(), "flags": self.uint32()}

    def optional_doubles(self, point: Any, names: tuple[str, ...]) -> None:
        for name in names:
            if self.chance(0.5):
                setattr(point, name, self.double())

    def metric(self) -> Metric:
        m = Metric(name=self.text(), description=self.text(), unit=self.text())
        if self.chance(0.3):
            m.metadata.extend(self.attributes())
        kind = self.r.randrange(6)
        n = self.r.choice([0, 1, 1, 2, 3])
        if kind == 0:
            pass  # no data: no events
        elif kind in (1, 2):
            data = m.gauge if kind == 1 else m.sum
            data.SetInParent()
            for _ in range(n):
                pt = NumberDataPoint(exemplars=self.exemplars(), **self.point_common())
                self.number(pt)
                data.data_points.append(pt)
            if kind == 2:
                m.sum.aggregation_temporality = self.int32()  # type: ignore[assignment]
                m.sum.is_monotonic = self.chance(0.5)
        elif kind == 3:
            m.histogram.SetInParent()
            m.histogram.aggregation_temporality = self.int32()  # type: ignore[assignment]
            for _ in range(n):
                hp = HistogramDataPoint(count=self.uint64(), exemplars=self.exemplars(),
                                        bucket_counts=[self.uint64() for _ in range(self.r.randrange(4))],
                                        explicit_bounds=[self.double() for _ in range(self.r.randrange(4))],
                                        **self.point_common())
                self.optional_doubles(hp, ("sum", "min", "max"))
                m.histogram.data_points.append(hp)
        elif kind == 4:
            m.exponential_histogram.SetInParent()
            m.exponential_histogram.aggregation_temporality = self.int32()  # type: ignore[assignment]
            for _ in range(n):
                ep = ExponentialHistogramDataPoint(count=self.uint64(), scale=self.int32(),
                                                   zero_count=self.uint64(),
                                                   zero_threshold=self.double(),
                                                   exemplars=self.exemplars(), **self.point_common())
                for buckets in (ep.positive, ep.negative):
                    if self.chance(0.7):
                        buckets.offset = self.int32()
                        buckets.bucket_counts.extend(self.uint64() for _ in range(self.r.randrange(4)))
                self.optional_doubles(ep, ("sum", "min", "max"))
                m.exponential_histogram.data_points.append(ep)
        else:
            m.summary.SetInParent()
            for _ in range(n):
                sp = SummaryDataPoint(count=self.uint64(), sum=self.double(), **self.point_common())
                for _ in range(self.r.randrange(3)):
                    sp.quantile_values.add(quantile=self.double(), value=self.double())
                m.summary.data_points.append(sp)
        return m

    def request(self, signal: str) -> bytes:
        groups, scopes, records = reference.FIELDS[signal]
        req: Any = reference.REQUESTS[signal]()
        make: Callable[[], Any] = {"logs": self.log_record, "traces": self.span,
                                   "metrics": self.metric}[signal]
        for _ in range(self.r.choice([0, 1, 1, 1, 2, 3])):
            group = getattr(req, groups).add()
            if self.chance(0.85):
                group.resource.CopyFrom(self.resource())
            if self.chance(0.3):
                group.schema_url = self.text()
            for _ in range(self.r.choice([0, 1, 1, 2])):
                sg = getattr(group, scopes).add()
                if self.chance(0.8):
                    sg.scope.CopyFrom(self.scope())
                if self.chance(0.3):
                    sg.schema_url = self.text()
                getattr(sg, records).extend(make() for _ in range(self.r.choice([0, 1, 2, 3])))
        return bytes(req.SerializeToString())


