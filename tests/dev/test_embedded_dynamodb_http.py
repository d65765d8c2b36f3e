"""The embedded DynamoDB's HTTP: kept-alive connections framed by Content-Length, and
expression texts parsed once whatever values each request carries."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from werkzeug.serving import make_server

from streamlease.dev import parsecache
from streamlease.dev.dynamodb import EmbeddedDynamoDB
from streamlease.dev.keepalive import MAX_BODY_BYTES, KeepAliveHandler, _content_length

AUTH = ("AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/aws4_request, "
        "SignedHeaders=host, Signature=0")


def headers(target: str, **extra: str) -> dict[str, str]:
    return {"X-Amz-Target": f"DynamoDB_20120810.{target}",
            "Content-Type": "application/x-amz-json-1.0", "Authorization": AUTH, **extra}


def raw_request(target: str, body: dict[str, Any], port: int) -> bytes:
    data = json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in headers(target).items())
    return (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{head}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


@dataclass(frozen=True)
class Served:
    port: int
    table: str  # a table of its own: moto's backend outlives a server in one process


@pytest.fixture
def server() -> Iterator[Served]:
    table = f"t-{uuid.uuid4().hex[:8]}"
    with EmbeddedDynamoDB() as embedded:
        conn = http.client.HTTPConnection("127.0.0.1", embedded.port, timeout=10)
        call(conn, "CreateTable", {
            "TableName": table, "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [{"AttributeName": "k", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "k", "AttributeType": "S"}]})
        conn.close()
        yield Served(embedded.port, table)


def call(conn: http.client.HTTPConnection, target: str, body: dict[str, Any],
         **extra: str) -> tuple[http.client.HTTPResponse, dict[str, Any]]:
    conn.request("POST", "/", body=json.dumps(body).encode(), headers=headers(target, **extra))
    answer = conn.getresponse()
    data = answer.read()
    return answer, json.loads(data) if data else {}


def test_a_connection_serves_request_after_request(server: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    ports = set()
    for i in range(5):
        answer, body = call(conn, "PutItem",
                            {"TableName": server.table, "Item": {"k": {"S": f"a{i}"}}})
        assert answer.status == 200, body
        assert answer.getheader("Connection") is None
        assert answer.getheader("Content-Length") is not None
        assert conn.sock is not None, "the server closed the connection"
        ports.add(conn.sock.getsockname()[1])
    assert len(ports) == 1
    answer, body = call(conn, "Scan", {"TableName": server.table})
    assert body["Count"] == 5
    conn.close()


def test_pipelined_requests_are_answered_in_order(server: Served) -> None:
    """Each body is read to exactly its Content-Length, so the next request line is found
    where it starts, even when both requests arrive in one packet."""
    first = raw_request("PutItem", {"TableName": server.table, "Item": {"k": {"S": "p"}}},
                        server.port)
    second = raw_request("GetItem", {"TableName": server.table, "Key": {"k": {"S": "p"}}},
                         server.port)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(first + second)
        reader = sock.makefile("rb")
        answers = []
        for _ in range(2):
            status = reader.readline()
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            answers.append((status, json.loads(reader.read(length))))
    assert [status.split()[1] for status, _ in answers] == [b"200", b"200"]
    assert answers[1][1]["Item"] == {"k": {"S": "p"}}


def test_a_body_sent_in_pieces_is_read_whole(server: Served) -> None:
    request = raw_request("PutItem", {"TableName": server.table, "Item": {"k": {"S": "split"}}},
                          server.port)
    cut = request.index(b"\r\n\r\n") + 10
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request[:cut])
        sock.sendall(request[cut:])
        assert sock.recv(65536).split(b" ")[1] == b"200"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    _, body = call(conn, "GetItem", {"TableName": server.table, "Key": {"k": {"S": "split"}}})
    assert body["Item"] == {"k": {"S": "split"}}
    conn.close()


def test_a_client_that_asks_to_close_is_closed(server: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    answer, _ = call(conn, "ListTables", {}, Connection="close")
    assert answer.status == 200
    assert answer.getheader("Connection") == "close"
    assert conn.sock is None


def test_a_request_without_a_length_is_served_and_its_connection_closed(
        server: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/")
    answer = conn.getresponse()
    answer.read()
    assert answer.getheader("Connection") == "close"


def serving(app: Callable[..., Any]) -> Iterator[int]:
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=KeepAliveHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_application_that_fails_gets_a_500_and_a_closed_connection() -> None:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        raise RuntimeError("boom")

    for port in serving(app):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/", body=b"{}")
        answer = conn.getresponse()
        answer.read()
        assert (answer.status, answer.getheader("Connection")) == (500, "close")


def test_what_an_application_writes_comes_before_what_it_returns() -> None:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        body = environ["wsgi.input"].read()
        start_response("200 OK", [("Content-Type", "text/plain")])(b"written:")
        return [b"returned:", body]

    for port in serving(app):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for body in (b"one", b"two"):
            conn.request("POST", "/", body=body)
            answer = conn.getresponse()
            assert answer.read() == b"written:returned:" + body
        conn.close()


@pytest.mark.parametrize("text,expected", [
    (None, None), ("12", 12), (" 0 ", 0), ("-1", None), ("x", None),
    (str(MAX_BODY_BYTES), MAX_BODY_BYTES), (str(MAX_BODY_BYTES + 1), None),
])
def test_content_length_is_read_strictly(text: str | None, expected: int | None) -> None:
    assert _content_length(text) == expected


# -- Expression texts parsed once -------------------------------------------------------------

UPDATE = "SET #v = :v, #n = if_not_exists(#n, :zero) + :one"
CONDITION = "attribute_not_exists(#v) OR #v < :v"


def conditional_update(conn: http.client.HTTPConnection, table: str, key: str,
                       value: int) -> tuple[int, dict[str, Any]]:
    answer, body = call(conn, "UpdateItem", {
        "TableName": table, "Key": {"k": {"S": key}}, "UpdateExpression": UPDATE,
        "ConditionExpression": CONDITION, "ReturnValues": "ALL_NEW",
        "ExpressionAttributeNames": {"#v": "v", "#n": "n"},
        "ExpressionAttributeValues": {":v": {"N": str(value)}, ":zero": {"N": "0"},
                                      ":one": {"N": "1"}}})
    return answer.status, body


def test_one_expression_text_answers_each_request_with_its_own_values(
        server: Served) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    before = parsecache._update_tree.cache_info()
    lexed = parsecache._condition_tokens.cache_info().hits
    outcomes = [conditional_update(conn, server.table, key, value)
                for key, value in (("a", 5), ("a", 7), ("a", 6), ("b", 1), ("a", 9))]
    statuses = [status for status, _ in outcomes]
    assert statuses == [200, 200, 400, 200, 200]
    assert outcomes[2][1]["__type"].endswith("ConditionalCheckFailedException")
    assert outcomes[4][1]["Attributes"] == {"k": {"S": "a"}, "v": {"N": "9"}, "n": {"N": "3"}}
    assert outcomes[3][1]["Attributes"] == {"k": {"S": "b"}, "v": {"N": "1"}, "n": {"N": "1"}}
    # Five requests, each reading the texts twice: one parse of each text at most.
    after = parsecache._update_tree.cache_info()
    assert after.misses - before.misses <= 1
    assert after.hits - before.hits >= 9
    assert parsecache._condition_tokens.cache_info().hits - lexed >= 9
    conn.close()


@pytest.mark.parametrize("field,text", [
    ("UpdateExpression", "SET #v = = :v"),
    ("ConditionExpression", "#v <> :v AND ("),  # moto's parser raises; DynamoDB refuses
    ("ConditionExpression", "#v = :v ~"),  # moto's lexer raises
])
def test_an_expression_that_does_not_parse_is_refused_every_time(
        server: Served, field: str, text: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    request: dict[str, Any] = {
        "TableName": server.table, "Key": {"k": {"S": "bad"}}, "UpdateExpression": "SET #v = :v",
        "ExpressionAttributeNames": {"#v": "v"},
        "ExpressionAttributeValues": {":v": {"N": "1"}}, field: text}
    for _ in range(2):
        answer, body = call(conn, "UpdateItem", request)
        assert answer.status == 400, body
        assert "ValidationException" in body["__type"]
    _, got = call(conn, "GetItem", {"TableName": server.table, "Key": {"k": {"S": "bad"}}})
    assert "Item" not in got
    conn.close()
