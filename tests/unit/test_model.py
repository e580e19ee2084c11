from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import mmh3
import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.errors import ConfigError, InvalidMessage, InvalidPayload, InvalidTask, InvalidTaskId
from scheduler.model import (
    BUCKET_MS,
    MAX_COST,
    MAX_NAME_CHARS,
    MAX_PAYLOAD_BYTES,
    MESSAGE_ID_SLICE,
    MESSAGE_VERSION,
    Message,
    Priority,
    Task,
    TaskId,
    check_name,
    check_shard_count,
    decode_message,
    decode_payload,
    encode_message,
    encode_payload,
    from_ms,
    minute_bucket,
    peek_release_fields,
    to_ms,
    valid_name,
)

run_at_ms = st.integers(min_value=0, max_value=(1 << 48) - 1)
names = st.text(min_size=1, max_size=40)
name_characters = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))
task_names = st.text(name_characters, min_size=1, max_size=40).filter(lambda text: not text.isspace())
"""Names a tenant or a type may have (`check_name`)."""
payloads = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=20,
)


def make_task(run_at: int = 1_796_202_000_250, **fields: Any) -> Task:
    values: dict[str, object] = dict(
        id=TaskId.new(run_at), tenant="board", type="sms", payload=encode_payload({"to": "+911234"}), run_at_ms=run_at
    )
    values.update(fields)
    return Task(**values)  # type: ignore[arg-type]


# --- task ids ---------------------------------------------------------------------


@given(run_at_ms)
def test_task_id_carries_its_run_at_and_is_a_version_7_uuid(ms: int) -> None:
    task_id = TaskId.new(ms)
    assert task_id.run_at_ms == ms
    assert task_id.uuid.version == 7
    assert task_id.uuid.variant == uuid.RFC_4122


@given(run_at_ms)
def test_task_id_round_trips_through_text_bytes_and_uuid(ms: int) -> None:
    task_id = TaskId.new(ms)
    assert TaskId.parse(str(task_id)) == task_id
    assert TaskId.from_bytes(task_id.bytes) == task_id
    assert TaskId.from_uuid(task_id.uuid) == task_id


@given(st.lists(run_at_ms, min_size=2, max_size=20))
def test_task_ids_order_by_run_at(times: list[int]) -> None:
    ids = [TaskId.new(ms) for ms in times]
    assert [task_id.run_at_ms for task_id in sorted(ids)] == sorted(times)


def test_fresh_ids_for_the_same_millisecond_differ() -> None:
    ids = {TaskId.new(1_796_202_000_000) for _ in range(10_000)}
    assert len(ids) == 10_000


@given(run_at_ms, names, names)
def test_an_idempotency_key_makes_the_same_id_every_time(ms: int, tenant: str, key: str) -> None:
    first = TaskId.for_key(ms, tenant, key)
    assert TaskId.for_key(ms, tenant, key) == first
    assert first.run_at_ms == ms
    assert first.uuid.version == 7


def test_the_same_key_of_other_tenants_or_times_makes_other_ids() -> None:
    ms = 1_796_202_000_000
    assert TaskId.for_key(ms, "board", "k1") != TaskId.for_key(ms, "college", "k1")
    assert TaskId.for_key(ms, "a", "bc") != TaskId.for_key(ms, "ab", "c")
    assert TaskId.for_key(ms, "board", "k1") != TaskId.for_key(ms + 1, "board", "k1")


@pytest.mark.parametrize(
    "text",
    ["", "not-a-uuid", "00000000-0000-0000-0000-000000000000", str(uuid.uuid4()), "01a235fb-6f7a-7761-ad68"],
)
def test_parse_refuses_what_is_not_a_task_id(text: str) -> None:
    with pytest.raises(InvalidTaskId):
        TaskId.parse(text)


def test_from_bytes_refuses_the_wrong_length() -> None:
    with pytest.raises(InvalidTaskId, match="16 bytes"):
        TaskId.from_bytes(b"\x01" * 15)


@pytest.mark.parametrize("ms", [-1, 1 << 48])
def test_run_at_outside_the_id_range_is_refused(ms: int) -> None:
    with pytest.raises(InvalidTask):
        TaskId.new(ms)


# --- shards -----------------------------------------------------------------------


@given(run_at_ms, st.integers(min_value=1, max_value=4096))
def test_shard_is_within_the_shard_count(ms: int, shard_count: int) -> None:
    assert 0 <= TaskId.new(ms).shard(shard_count) < shard_count


def test_shard_is_murmur3_of_the_id_bytes_pinned_to_known_values() -> None:
    # murmur3_x86_32 with seed 0 is a published function; these values must never change,
    # or every stored task would be looked for in the wrong partition.
    assert mmh3.hash(b"hello", 0, signed=False) == 0x248BFA47  # the reference test vector
    task_id = TaskId.parse("01a235fb-6f7a-7761-ad68-981e4f4f54ab")
    assert mmh3.hash(task_id.bytes, 0, signed=False) == 3_613_573_460
    assert task_id.shard(64) == 3_613_573_460 % 64 == 20
    assert task_id.shard(7) == 3_613_573_460 % 7


def test_shard_is_the_same_in_another_process() -> None:
    ids = [TaskId.new(1_796_202_000_000 + n) for n in range(50)]
    script = (
        "import sys; from scheduler.model import TaskId; "
        "print(' '.join(str(TaskId.parse(t).shard()) for t in sys.argv[1:]))"
    )
    output = subprocess.run(
        [sys.executable, "-c", script, *map(str, ids)], capture_output=True, text=True, check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.split()
    assert [int(shard) for shard in output] == [task_id.shard() for task_id in ids]


def test_shards_spread_evenly_even_for_ids_of_one_millisecond() -> None:
    counts = Counter(TaskId.new(1_796_202_000_000).shard(64) for _ in range(64_000))
    assert len(counts) == 64
    # 1,000 expected per shard, standard deviation ~31: 6 sigma either way.
    assert min(counts.values()) > 800 and max(counts.values()) < 1200


@pytest.mark.parametrize("count", [0, -1, 4097, 1.5])
def test_bad_shard_counts_are_refused(count: object) -> None:
    with pytest.raises(ConfigError):
        check_shard_count(count)  # type: ignore[arg-type]


# --- buckets and times --------------------------------------------------------------


@given(run_at_ms)
def test_bucket_is_the_start_of_the_minute(ms: int) -> None:
    bucket = minute_bucket(ms)
    assert bucket % BUCKET_MS == 0
    assert bucket <= ms < bucket + BUCKET_MS


def test_bucket_of_a_known_time() -> None:
    moment = datetime(2026, 12, 2, 9, 0, 59, 999_000, tzinfo=timezone.utc)
    assert from_ms(minute_bucket(to_ms(moment))) == datetime(2026, 12, 2, 9, 0, tzinfo=timezone.utc)


@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 1, 1), timezones=st.just(timezone.utc)))
def test_to_ms_and_from_ms_round_trip_to_the_millisecond(moment: datetime) -> None:
    assert from_ms(to_ms(moment)) == moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def test_to_ms_respects_the_time_zone() -> None:
    ten_in_kolkata = datetime(2026, 12, 2, 10, 0, tzinfo=ZoneInfo("Asia/Kolkata"))
    assert to_ms(ten_in_kolkata) == to_ms(datetime(2026, 12, 2, 4, 30, tzinfo=timezone.utc))


def test_a_naive_datetime_is_refused_with_advice() -> None:
    with pytest.raises(InvalidTask, match="no time zone"):
        to_ms(datetime(2026, 12, 2, 10, 0))


def test_a_time_before_1970_is_refused() -> None:
    with pytest.raises(InvalidTask, match="1970"):
        to_ms(datetime(1969, 12, 31, tzinfo=timezone.utc))


# --- payloads, tasks and messages -------------------------------------------------------


@given(payloads)
def test_payloads_round_trip_through_msgpack(payload: object) -> None:
    assert decode_payload(encode_payload(payload, max_bytes=1 << 20)) == payload


def test_a_payload_msgpack_cannot_encode_is_refused() -> None:
    with pytest.raises(InvalidPayload, match="msgpack"):
        encode_payload({"when": object()})


def test_a_payload_over_the_limit_is_refused_and_one_at_it_accepted() -> None:
    at_limit = b"x" * (MAX_PAYLOAD_BYTES - 3)  # a bin16 header is 3 bytes
    assert len(encode_payload(at_limit)) == MAX_PAYLOAD_BYTES
    with pytest.raises(InvalidPayload, match="limit"):
        encode_payload(at_limit + b"x")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tenant", "", "tenant"),
        ("type", "", "type"),
        ("payload", {"not": "bytes"}, "payload"),
        ("max_attempts", 0, "max_attempts"),
        ("max_attempts", 101, "from 1 to 100"),
        ("attempt", 6, "attempt"),
        ("priority", "urgent", "priority"),
        ("idempotency_key", "", "idempotency key"),
        ("run_at_ms", -5, "1970"),
        ("cost", 0, "cost must be an integer from 1 to 1000000 .units of the tenant's rate limit"),
        ("cost", MAX_COST + 1, "cost must be an integer from 1 to 1000000"),
        ("cost", -500, "got -500"),
        ("cost", True, "got True"),
        ("cost", 2.0, "got 2.0"),
        ("cost", "500", "got '500'"),
        ("cost", None, "got None"),
    ],
)
def test_a_malformed_task_is_refused(field: str, value: Any, match: str) -> None:
    with pytest.raises(InvalidTask, match=match):
        make_task(**{field: value})


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tenant", "b" * (MAX_NAME_CHARS + 1), "a task's tenant is at most 100 characters, got 101: 'bbbb"),
        ("type", "s" * 1000, "a task's type is at most 100 characters, got 1000: 'ssss"),
        ("tenant", "board\n", r"tenant may hold only printable characters, got 'board\\n': a control character "
                               r"\(U\+000A\) at position 5"),
        ("tenant", "bo\x00ard", r"a control character \(U\+0000\) at position 2"),
        ("type", "sms\t", r"type may hold only printable characters, .*\(U\+0009\)"),
        ("type", "sms\x7f", r"a control character \(U\+007F\)"),
        ("tenant", "board\x85", r"a control character \(U\+0085\)"),  # C1: NEL
        ("tenant", "board\u2028x", r"a line separator \(U\+2028\)"),
        ("tenant", "\u202eboard", r"an invisible formatting character \(U\+202E\) at position 0"),  # right-to-left
        ("tenant", "bo\u200bard", r"an invisible formatting character \(U\+200B\)"),  # zero-width space
        ("tenant", "board\ud800", r"a lone surrogate, which is not valid Unicode text \(U\+D800\)"),
        ("tenant", " ", "a task's tenant must not be only whitespace, got ' '"),
        ("type", "\u3000\u00a0 ", "a task's type must not be only whitespace"),
        ("tenant", None, "a task needs a tenant: a non-empty string naming who owns it"),
        ("type", 7, "a task needs a type: a non-empty string naming its handler"),
    ],
)
def test_a_tenant_or_type_that_is_too_long_or_not_printable_is_refused(field: str, value: Any, match: str) -> None:
    with pytest.raises(InvalidTask, match=match):
        make_task(**{field: value})
    with pytest.raises(InvalidTask, match=match):
        check_name(field, value)
    assert not valid_name(value)


@pytest.mark.parametrize("name", [
    "b" * MAX_NAME_CHARS,  # exactly at the limit
    "क" * MAX_NAME_CHARS,  # 100 characters, 300 bytes
    "कॉलेज", "東京大学", "Zürich board", "board one", " board", "a\u00a0b",
    "می\u200cخواهم",  # Persian, with the zero-width non-joiner it needs
    "\U0001F469\u200d\U0001F4BB",  # an emoji sequence joined by a zero-width joiner
    "\U000E01EF\U0010FFFD",  # a variation selector and a private-use character
])
def test_names_of_any_script_up_to_the_limit_are_accepted(name: str) -> None:
    assert valid_name(name) and check_name("tenant", name) == name
    assert (make_task(tenant=name).tenant, make_task(type=name).type) == (name, name)


def test_a_refused_long_name_is_quoted_short() -> None:
    with pytest.raises(InvalidTask) as refused:
        check_name("tenant", "x" * 10_000)
    assert str(refused.value) == f"a task's tenant is at most 100 characters, got 10000: '{'x' * 40}…'"
    with pytest.raises(InvalidTask, match=r"got '" + "y" * 40 + r"…': a control character \(U\+000A\) at position 50"):
        check_name("type", "y" * 50 + "\n")


@given(st.text(max_size=110) | st.text(st.sampled_from(" \u00a0\u3000a\u200d\u200b\n"), max_size=4))
def test_valid_name_and_check_name_agree(text: str) -> None:
    try:
        check_name("tenant", text)
    except InvalidTask:
        assert not valid_name(text)
    else:
        assert valid_name(text)
        assert 0 < len(text) <= MAX_NAME_CHARS and not text.isspace()
        assert text.encode()  # valid Unicode: no lone surrogate


def test_a_task_costs_1_unless_given_a_cost_up_to_the_limit() -> None:
    assert make_task().cost == 1
    assert make_task(cost=500).cost == 500
    assert make_task(cost=MAX_COST).cost == MAX_COST
    positional = Task(TaskId.new(5), "board", "sms", b"\x80", 5, Priority.LOW, 1, 3, "k")  # as before there was a cost
    assert positional.cost == 1
    assert Task.unchecked(positional.id, "board", "sms", b"\x80", 5, Priority.LOW, 1, 3, "k") == positional


def test_priority_parse_names_the_choices() -> None:
    assert Priority.parse("high") is Priority.HIGH
    with pytest.raises(InvalidTask, match="high, normal, low"):
        Priority.parse("urgent")


def test_a_task_knows_its_partition() -> None:
    task = make_task(run_at=1_796_202_030_000)
    partition = task.partition(64)
    assert partition.minute_bucket == 1_796_202_000_000
    assert partition.shard == task.id.shard(64)


@given(
    run_at_ms,
    task_names,
    task_names,
    st.sampled_from(list(Priority)),
    st.integers(1, 10),
    st.integers(0, 2**63 - 1),
    st.none() | names,
    st.binary(max_size=300),
    st.just(1) | st.integers(1, MAX_COST),
)
def test_messages_round_trip(
    ms: int, tenant: str, type_: str, priority: Priority, attempt: int, fence: int, key: str | None, payload: bytes,
    cost: int,
) -> None:
    task = Task(
        id=TaskId.new(ms), tenant=tenant, type=type_, payload=payload, run_at_ms=ms, priority=priority,
        attempt=attempt, max_attempts=10, idempotency_key=key, cost=cost,
    )
    encoded = encode_message(task, fence)
    assert decode_message(encoded) == Message(task, fence)
    assert encoded[MESSAGE_ID_SLICE] == task.id.bytes


def _fields_before_costs(task: Task, fence: int) -> list[object]:
    """The 11 fields of a message as they were before tasks had a cost."""
    return [MESSAGE_VERSION, task.id.bytes, task.tenant, task.type, task.priority.code,
            task.run_at_ms - task.id.run_at_ms, task.attempt, task.max_attempts, fence, task.idempotency_key,
            task.payload]


@pytest.mark.parametrize("key", [None, "order-17"])
def test_a_message_of_cost_1_is_byte_for_byte_the_message_without_a_cost(key: str | None) -> None:
    task = make_task(payload=b"p" * 40, idempotency_key=key, attempt=2, run_at=1_796_202_000_250)
    retry = Task(task.id, task.tenant, task.type, task.payload, task.run_at_ms + 3000, attempt=2, idempotency_key=key)
    for each in (task, retry):
        assert encode_message(each, 77) == msgpack.packb(_fields_before_costs(each, 77), use_bin_type=True)


@pytest.mark.parametrize(("cost", "extra_bytes"), [(2, 1), (127, 1), (128, 2), (500, 3), (65_536, 5), (MAX_COST, 5)])
def test_a_cost_other_than_1_is_a_twelfth_field_after_the_payload(cost: int, extra_bytes: int) -> None:
    task = make_task(cost=cost)
    without = msgpack.packb(_fields_before_costs(task, 77), use_bin_type=True)
    encoded = encode_message(task, 77)
    assert msgpack.unpackb(encoded) == [*msgpack.unpackb(without), cost]
    assert len(encoded) == len(without) + extra_bytes  # the array header stays one byte
    assert encoded[MESSAGE_ID_SLICE] == task.id.bytes


def test_a_message_costs_little_more_than_its_payload() -> None:
    task = make_task(payload=b"p" * 160, tenant="board", type="sms")
    overhead = len(encode_message(task, fence=123_456_789)) - len(task.payload)
    assert overhead <= 64, overhead


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\xc1", "not msgpack"),
        (msgpack.packb({"a": 1}), "not a msgpack array"),
        (msgpack.packb([2, b""]), "version"),
        (msgpack.packb([1, b"x"]), "fields"),
        (msgpack.packb([1, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b""]), "invalid task"),
        (msgpack.packb([1, "str-id", "t", "sms", 1, 0, 1, 1, 7, None, b""]), "wrong types"),
        (msgpack.packb([1, TaskId.new(5).bytes, "t", "sms", 9, 5, 1, 1, 7, None, b""]), "priority"),
        (msgpack.packb([1, TaskId.new(5).bytes, "t", "sms", 1, 0, 1, 1, 7, None, b"", 0]), "cost must be an integer"),
        (msgpack.packb([1, TaskId.new(5).bytes, "t", "sms", 1, 0, 1, 1, 7, None, b"", 5, 5]), "13 fields"),
    ],
)
def test_garbage_is_an_invalid_message_never_a_crash(data: bytes, match: str) -> None:
    with pytest.raises(InvalidMessage, match=match):
        decode_message(data)


@given(st.binary(max_size=200))
def test_no_bytes_crash_the_decoder(data: bytes) -> None:
    try:
        decode_message(data)
    except InvalidMessage:
        pass


def test_retry_keeps_the_id_and_moves_the_time() -> None:
    first = make_task()
    retry = Task(
        id=first.id, tenant=first.tenant, type=first.type, payload=first.payload,
        run_at_ms=first.run_at_ms + 2_000, attempt=2,
    )
    assert retry.run_at - first.run_at == timedelta(seconds=2)
    assert retry.id.run_at_ms == first.run_at_ms


def test_ids_made_after_a_fork_differ_from_the_parents() -> None:
    """New ids draw on a per-process buffer of OS randomness; a forked child must get a
    buffer of its own, or parent and child would mint the same ids."""
    script = (
        "import os, sys\n"
        "from scheduler.model import TaskId\n"
        "TaskId.new(0)\n"  # the parent's buffer is filled before the fork
        "read, write = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.write(write, str(TaskId.new(0)).encode()); os._exit(0)\n"
        "os.wait()\n"
        "child = os.read(read, 100).decode()\n"
        "print(child, TaskId.new(0))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    child, parent = result.stdout.split()
    assert child != parent


def test_a_payload_that_fails_to_encode_leaves_the_next_one_whole() -> None:
    with pytest.raises(InvalidPayload):
        encode_payload({"a": [1, 2, {3}]})
    assert decode_payload(encode_payload({"b": "ok"})) == {"b": "ok"}


def test_ids_made_by_many_threads_at_once_are_all_distinct() -> None:
    made: list[list[TaskId]] = [[] for _ in range(4)]

    def make(into: list[TaskId]) -> None:
        into.extend(TaskId.new(0) for _ in range(20_000))

    threads = [threading.Thread(target=make, args=(into,)) for into in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    every = [task_id for into in made for task_id in into]
    assert len(every) == 80_000
    assert len(set(every)) == 80_000


@given(
    tenant=st.one_of(st.just("board"), st.just(""), st.integers(0, 1), st.just("b" * MAX_NAME_CHARS),
                     st.just("b" * (MAX_NAME_CHARS + 1)), st.just("bo\nard"), st.just("\u3000"), st.just("कॉलेज")),
    type_=st.one_of(st.just("sms"), st.just(""), st.none(), st.just("s\x00"), st.just(" "), st.just("s" * 101)),
    priority=st.one_of(st.integers(-1, 3), st.just("high")),
    run_at_delta=st.integers(-2_000_000_000_000, 5000),
    attempt=st.one_of(st.integers(-1, 102), st.booleans()),
    max_attempts=st.one_of(st.integers(0, 102), st.just("5")),
    key=st.one_of(st.none(), st.just(""), st.just("k"), st.just(7)),
    cost=st.one_of(st.just("absent"), st.integers(-1, 3), st.integers(MAX_COST - 1, MAX_COST + 1), st.booleans(),
                   st.just(2.0), st.none()),
)
def test_decoding_a_message_accepts_exactly_the_tasks_the_checked_constructor_accepts(
    tenant: Any, type_: Any, priority: Any, run_at_delta: int, attempt: Any, max_attempts: Any, key: Any, cost: Any
) -> None:
    task_id = TaskId.new(1_796_202_000_000)
    fields = [MESSAGE_VERSION, task_id.bytes, tenant, type_, priority, run_at_delta, attempt, max_attempts, 3, key,
              b"\x80"]
    raw = msgpack.packb(fields if cost == "absent" else [*fields, cost], use_bin_type=True)
    try:
        expected: Task | None = Task(task_id, tenant, type_, b"\x80", task_id.run_at_ms + run_at_delta,
                                     Priority.from_code(priority), attempt, max_attempts, key,
                                     1 if cost == "absent" else cost)
    except InvalidTask:
        expected = None
    if expected is None:
        with pytest.raises(InvalidMessage):
            decode_message(raw)
    else:
        assert decode_message(raw) == Message(expected, 3)


# --- what a dispatcher reads before releasing a message -----------------------------------

tenants = st.one_of(
    task_names.filter(lambda text: len(text.encode()) <= 31),  # up to 31 bytes: a fixstr
    st.text(st.characters(codec="utf-8", exclude_categories=("Cc", "Cf", "Zl", "Zp")), min_size=11,
            max_size=MAX_NAME_CHARS).filter(lambda text: not text.isspace()),  # often over 31 bytes: str8
    st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=86,
            max_size=MAX_NAME_CHARS),  # 3 bytes each, so over 255 bytes: str16
    st.sampled_from(["कॉलेज-बोर्ड-परिणाम-२०२६", "board", "b" * 31, "b" * 32, "ü" * 16]),
)


@given(
    tenant=tenants,
    type_=task_names,
    priority=st.sampled_from(list(Priority)),
    cost=st.one_of(st.just(1), st.integers(1, 300), st.integers(1, MAX_COST)),
    key=st.none() | names,
    payload=st.one_of(st.binary(max_size=100), st.binary(min_size=250, max_size=70_000)),
    attempt=st.integers(1, 10),
    delay_ms=st.integers(0, 10**9),
    fence=st.integers(0, 2**63 - 1),
)
def test_peeking_at_a_message_agrees_with_decoding_it(
    tenant: str, type_: str, priority: Priority, cost: int, key: str | None, payload: bytes, attempt: int,
    delay_ms: int, fence: int,
) -> None:
    task_id = TaskId.new(1_796_202_000_000)
    task = Task(task_id, tenant, type_, payload, task_id.run_at_ms + (delay_ms if attempt > 1 else 0), priority,
                attempt, 10, key, cost)
    encoded = encode_message(task, fence)
    decoded = decode_message(encoded).task
    assert peek_release_fields(encoded) == (decoded.tenant, decoded.priority.code, decoded.cost)
    assert peek_release_fields(encoded) == (tenant, priority.code, cost)


@given(st.binary(max_size=200))
def test_peeking_at_garbage_is_an_invalid_message_or_agrees_with_decoding(data: bytes) -> None:
    try:
        peeked = peek_release_fields(data)
    except InvalidMessage:
        return
    try:
        task = decode_message(data).task
    except InvalidMessage:
        return  # peeking checks only the three fields it reads
    assert peeked == (task.tenant, task.priority.code, task.cost)


@pytest.mark.parametrize(
    "fields",
    [
        [1, b"x" * 16, "", "sms", 1, 0, 1, 1, 7, None, b""],  # no tenant
        [1, b"x" * 16, "t", "sms", 3, 0, 1, 1, 7, None, b""],  # no such priority
        [1, b"x" * 16, "t", "sms", True, 0, 1, 1, 7, None, b""],  # a bool for a priority code
        [1, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b"", 0],  # cost 0
        [1, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b"", True],  # a bool for a cost
        [1, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b"", MAX_COST + 1],
        [1, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b"", 5, 5],  # 13 fields
        [2, b"x" * 16, "t", "sms", 1, 0, 1, 1, 7, None, b""],  # another version
    ],
)
def test_peeking_refuses_a_tenant_priority_or_cost_no_task_could_have(fields: list[object]) -> None:
    with pytest.raises(InvalidMessage):
        peek_release_fields(msgpack.packb(fields, use_bin_type=True))
