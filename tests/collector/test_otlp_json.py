"""OTLP/JSON as the OTLP specification's examples write it (opentelemetry-proto examples/trace.json)."""

from __future__ import annotations

import json
import urllib.request

# opentelemetry-proto/examples/trace.json, extended with the other value kinds the spec allows:
# int64 as a string and as a number, arrays, kvlists, bytes (base64), events, links, status, and
# fields this version of the proto does not know (must be ignored).
SPEC_EXAMPLE = {
    "resourceSpans": [
        {
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "my.service"}}]},
            "scopeSpans": [
                {
                    "scope": {
                        "name": "my.library",
                        "version": "1.0.0",
                        "attributes": [{"key": "my.scope.attribute", "value": {"stringValue": "some scope attribute"}}],
                    },
                    "spans": [
                        {
                            "traceId": "5B8EFFF798038103D269B633813FC60C",
                            "spanId": "EEE19B7EC3C1B174",
                            "parentSpanId": "EEE19B7EC3C1B173",
                            "name": "I'm a server span",
                            "startTimeUnixNano": "1544712660000000000",
                            "endTimeUnixNano": "1544712661000000000",
                            "kind": 2,
                            "attributes": [
                                {"key": "my.span.attr", "value": {"stringValue": "some value"}},
                                {"key": "count.as.string", "value": {"intValue": "9007199254740993"}},
                                {"key": "count.as.number", "value": {"intValue": 42}},
                                {"key": "ratio", "value": {"doubleValue": 0.25}},
                                {"key": "ok", "value": {"boolValue": True}},
                                {"key": "list",
                                 "value": {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "two"}]}}},
                                {"key": "map",
                                 "value": {"kvlistValue": {"values": [{"key": "k", "value": {"stringValue": "v"}}]}}},
                                {"key": "raw", "value": {"bytesValue": "AQID"}},
                                {"key": "spanrl.rollout.id", "value": {"stringValue": "json-rollout"}},
                                {"key": "spanrl.llm.prompt_token_ids",
                                 "value": {"arrayValue": {"values": [{"intValue": "3"}, {"intValue": 4}]}}},
                            ],
                            "events": [
                                {
                                    "timeUnixNano": 1544712660500000000,
                                    "name": "gen_ai.evaluation.result",
                                    "attributes": [
                                        {"key": "gen_ai.evaluation.name", "value": {"stringValue": "relevance"}},
                                        {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": 0.5}},
                                    ],
                                }
                            ],
                            "links": [{"traceId": "0102030405060708090a0b0c0d0e0f10", "spanId": "0102030405060708",
                                       "attributes": []}],
                            "status": {"code": 2, "message": "boom"},
                            "flags": 257,
                            "someFutureField": {"nested": [1, 2, 3]},
                        }
                    ],
                }
            ],
            "schemaUrl": "https://opentelemetry.io/schemas/1.4.0",
        }
    ]
}


def _post(url: str, doc: object) -> tuple[int, dict]:
    req = urllib.request.Request(f"{url}/v1/traces", data=json.dumps(doc).encode(),
                                 headers={"content-type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, json.loads(resp.read())


def test_spec_example_json_lands_correctly(collector):
    status, reply = _post(collector.http_endpoint, SPEC_EXAMPLE)
    assert (status, reply) == (200, {})
    row = collector.store.sql("SELECT * FROM spans").to_pylist()[0]
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert (row["span_id"], row["parent_span_id"]) == ("eee19b7ec3c1b174", "eee19b7ec3c1b173")
    assert (row["name"], row["kind"], row["service_name"]) == ("I'm a server span", "SERVER", "my.service")
    assert (row["start_ns"], row["end_ns"]) == (1544712660000000000, 1544712661000000000)
    assert (row["status_code"], row["status_message"]) == ("ERROR", "boom")
    assert (row["scope_name"], row["scope_version"], row["rollout_id"]) == ("my.library", "1.0.0", "json-rollout")
    assert row["prompt_token_ids"] == [3, 4]
    assert json.loads(row["attributes"]) == {
        "my.span.attr": "some value",
        "count.as.string": 9007199254740993,
        "count.as.number": 42,
        "ratio": 0.25,
        "ok": True,
        "list": [1, "two"],
        "map": {"k": "v"},
        "raw": "AQID",
        "spanrl.rollout.id": "json-rollout",
    }
    assert (json.loads(row["links"])
            == [{"trace_id": "0102030405060708090a0b0c0d0e0f10", "span_id": "0102030405060708", "attributes": {}}])
    rewards = collector.store.sql("SELECT name, value, time_ns, source FROM rewards").to_pylist()
    assert rewards == [{"name": "relevance", "value": 0.5, "time_ns": 1544712660500000000, "source": "event"}]


def test_json_bad_hex_id_rejects_that_span_only(collector):
    doc = json.loads(json.dumps(SPEC_EXAMPLE))
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    good = json.loads(json.dumps(spans[0]))
    good["spanId"] = "00000000000000aa"
    spans[0]["traceId"] = "not-hex-at-all"
    spans.append(good)
    status, reply = _post(collector.http_endpoint, doc)
    assert status == 200
    assert reply["partialSuccess"]["rejectedSpans"] == "1"
    assert "traceId 'not-hex-at-all' is not hex" in reply["partialSuccess"]["errorMessage"]
    assert [r["span_id"] for r in collector.store.sql("SELECT span_id FROM spans").to_pylist()] == ["00000000000000aa"]


def test_empty_json_request_is_accepted(collector):
    assert _post(collector.http_endpoint, {}) == (200, {})
    assert _post(collector.http_endpoint, {"resourceSpans": []}) == (200, {})
    assert collector.store.span_count() == 0
