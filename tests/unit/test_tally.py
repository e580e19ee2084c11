"""Counting messages by tenant and type from their bytes gives what decoding them gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.model import Task, TaskId, decode_message, encode_message
from scheduler.visibility.tally import decode_tally, group_key, tally

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF, blacklist_categories=("Cs", "Cc", "Cf", "Zs", "Zl", "Zp")),
                min_size=1, max_size=100)


@given(st.lists(st.tuples(names, names, st.integers(1, 4), st.booleans()), min_size=1, max_size=30))
def test_the_tally_of_messages_equals_counting_their_decoded_fields(
        specs: list[tuple[str, str, int, bool]]) -> None:
    messages = []
    expected_first: dict[tuple[str, str], int] = {}
    expected_retry: dict[tuple[str, str], int] = {}
    for i, (tenant, type_, attempt, keyed) in enumerate(specs):
        task_id = TaskId.new(1_800_000_000_000 + i)
        run_at = task_id.run_at_ms + (0 if attempt == 1 else 10 ** (attempt + 1))  # deltas of 1 to 5 bytes
        task = Task(task_id, tenant, type_, b"p" * i, run_at, attempt=attempt, max_attempts=5,
                    idempotency_key=f"k{i}" if keyed else None, cost=1 + i % 3)
        message = encode_message(task, 3)
        decoded = decode_message(message)
        assert (decoded.task.tenant, decoded.task.type) == (tenant, type_)
        messages.append(message)
        into = expected_first if attempt == 1 else expected_retry
        into[(tenant, type_)] = into.get((tenant, type_), 0) + 1
    first, retries = decode_tally(tally(messages))
    assert first == expected_first
    assert retries == expected_retry


def test_bytes_that_are_not_a_message_are_left_out() -> None:
    assert group_key(b"") == b"" and group_key(b"\x00" * 30) == b""
    assert decode_tally(tally([b"garbage", b"\x9b" + b"\xff" * 40])) == ({}, {})

