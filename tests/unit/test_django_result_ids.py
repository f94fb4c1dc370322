"""The ids of `rqlite_queue.django`'s task results: each names one message (the Django queue,
the group, the seq) and reads back as it; anything else is no id (TaskResultDoesNotExist)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("django")

from rqlite_queue.django.results import message_of, result_id

names = st.text(min_size=1, max_size=60)
seqs = st.integers(min_value=0, max_value=2**62)


@given(names, names, seqs)
def test_an_id_names_its_message_and_is_url_safe(queue: str, group: str, seq: int) -> None:
    made = result_id(queue, group, seq)
    assert message_of(made) == (queue, group, seq)
    assert set(made) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")


@given(st.text(max_size=80))
def test_any_other_string_is_no_id_or_the_id_it_spells(text: str) -> None:
    found = message_of(text)
    assert found is None or result_id(*found) == text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "123",
        "ZGVmYXVsdA.Zw",  # no seq
        "ZGVmYXVsdA.Zw.01",  # a seq with a leading zero
        "ZGVmYXVsdA.Zw.-1",
        "ZGVmYXVsdA==.Zw.1",  # padded
        "ZGVmYXVsdB.Zw.1",  # not the one spelling of its bytes
        "ZGVmYXVsdA.Zw.1.",
        "/w.Zw.1",  # not UTF-8, not base64url
        "_w.Zw.1",  # base64url, not UTF-8
    ],
)
def test_what_is_not_an_id(text: str) -> None:
    assert message_of(text) is None
