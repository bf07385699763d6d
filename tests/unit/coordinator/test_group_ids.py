"""A commit never creates a group without a usable id (fuzz finding F3, docs/FUZZING.md)."""

from __future__ import annotations

from typing import Any

from ads_broker import errors

from .support import FakeClock, make_coordinator


def test_null_or_empty_group_id_commit_is_invalid_and_creates_no_group() -> None:
    coord = make_coordinator(FakeClock())
    assert coord.validate_offset_commit("g", -1, "", None) == 0
    null: Any = None  # what a request with a null group id decoded to before the codec refused it
    assert coord.validate_offset_commit(null, -1, "", None) == errors.INVALID_GROUP_ID
    assert coord.validate_offset_commit("", -1, "", None) == errors.INVALID_GROUP_ID
    assert coord.list_groups() == [("g", "", "Empty")]
