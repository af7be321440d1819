"""The part size of a multipart upload keeps every object within S3's 10,000 parts."""

from __future__ import annotations

from tiercache.store.multipart import MAX_PARTS, part_size_for

MiB = 1024 * 1024


def test_the_configured_part_size_serves_while_the_parts_fit() -> None:
    assert part_size_for(0, 16 * MiB) == 16 * MiB
    assert part_size_for(MAX_PARTS * 16 * MiB, 16 * MiB) == 16 * MiB


def test_a_larger_object_gets_the_smallest_whole_mib_that_fits() -> None:
    size = MAX_PARTS * 16 * MiB + 1
    part = part_size_for(size, 16 * MiB)
    assert part == 17 * MiB
    assert -(-size // part) <= MAX_PARTS
    huge = 5 * 1024**4  # S3's largest object, 5 TiB
    part = part_size_for(huge, 8 * MiB)
    assert part % MiB == 0 and -(-huge // part) <= MAX_PARTS
    assert -(-huge // (part - MiB)) > MAX_PARTS  # no smaller whole MiB would do
