"""CUDA_VISIBLE_DEVICES parsing: indices, UUIDs, MIG ids, duplicates, empty and invalid entries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.core.visible_devices import classify_entry, parse_visible_devices

UUID = "GPU-8f6b9e3a-1c2d-4e5f-9a8b-7c6d5e4f3a2b"
MIG_NEW = "MIG-3b5e8f0c-1d2a-5b4c-8e9f-0a1b2c3d4e5f"
MIG_OLD = "MIG-GPU-8f6b9e3a-1c2d-4e5f-9a8b-7c6d5e4f3a2b/1/0"


def test_unset_means_all_visible() -> None:
    vd = parse_visible_devices(None)
    assert not vd.is_set and vd.count is None and not vd.hides_all


@pytest.mark.parametrize("raw", ["", " "])
def test_empty_hides_all(raw: str) -> None:
    vd = parse_visible_devices(raw)
    assert vd.is_set and vd.hides_all and vd.count == 0


def test_indices() -> None:
    vd = parse_visible_devices("0,1,3")
    assert vd.entries == ("0", "1", "3") and vd.kinds == ("index",) * 3 and not vd.duplicates


def test_duplicate_index_detected_including_leading_zeros() -> None:
    assert parse_visible_devices("0,0").duplicates == ("0",)
    assert parse_visible_devices("1,01,2").duplicates == ("1",)


def test_duplicate_uuid() -> None:
    vd = parse_visible_devices(f"{UUID},{UUID}")
    assert vd.duplicates == (UUID,) and vd.kinds == ("uuid", "uuid")


def test_mig_ids_both_formats() -> None:
    assert classify_entry(MIG_NEW) == "mig"
    assert classify_entry(MIG_OLD) == "mig"
    assert parse_visible_devices(f"{MIG_NEW},{MIG_OLD}").kinds == ("mig", "mig")


def test_empty_entry_stops_the_list() -> None:
    vd = parse_visible_devices("0,1,,2")
    assert vd.entries == ("0", "1") and vd.empty_entries == 1 and vd.notes


def test_invalid_entry_stops_the_list() -> None:
    vd = parse_visible_devices("0,gpu1,2")
    assert vd.entries == ("0",) and vd.invalid == ("gpu1",)


def test_minus_one_hides_everything() -> None:
    vd = parse_visible_devices("-1")
    assert vd.hides_all and vd.invalid == ("-1",)


@given(st.one_of(st.none(), st.text()))
def test_any_text_parses_without_error(raw) -> None:
    vd = parse_visible_devices(raw)
    assert set(vd.duplicates) <= {
        e.lstrip("0") or "0" if k == "index" else e for e, k in zip(vd.entries, vd.kinds)
    }
    assert len(vd.entries) == len(vd.kinds)
    if raw is not None:
        assert vd.count == len(vd.entries)


@given(st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=8))
def test_index_lists_round_trip(indices: list[int]) -> None:
    vd = parse_visible_devices(",".join(map(str, indices)))
    assert vd.entries == tuple(map(str, indices))
    assert bool(vd.duplicates) == (len(set(indices)) != len(indices))
