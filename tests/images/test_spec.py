"""mediasrv.images.spec: the width, height and format query parameters."""
from __future__ import annotations

import pytest

from mediasrv.base.errors import BadRequest
from mediasrv.images.spec import TransformSpec, parse_transform, query_arguments


def test_parse_transform_absent_means_passthrough() -> None:
    assert parse_transform({}) is None
    assert parse_transform({"v": ["3"], "expires": ["1"], "signature": ["x"]}) is None


@pytest.mark.parametrize(("args", "expected"), [
    ({"width": ["160"]}, TransformSpec(160, None, None)),
    ({"height": ["60"]}, TransformSpec(None, 60, None)),
    ({"format": ["webp"]}, TransformSpec(None, None, "webp")),
    ({"width": ["1"], "height": ["8192"], "format": ["jpeg"]}, TransformSpec(1, 8192, "jpeg")),
    ({"width": [b"50"], "format": [b"png"]}, TransformSpec(50, None, "png")),
    ({"width": ["0160"], "v": ["x", "y"]}, TransformSpec(160, None, None)),
    # issue 11 item 7: case-folded, and jpg is jpeg (one cached result for every spelling)
    ({"format": ["JPEG"]}, TransformSpec(None, None, "jpeg")),
    ({"format": ["jpg"]}, TransformSpec(None, None, "jpeg")),
    ({"format": [b"WebP"]}, TransformSpec(None, None, "webp")),
])
def test_parse_transform_accepts(args: dict, expected: TransformSpec) -> None:
    assert parse_transform(args) == expected


@pytest.mark.parametrize("value", ["-1", "abc", "0", "1.5", "1e3", "100000", " 5", "5 ", "", "8193",
                                   "+5", "0x10", "\uff15", "\u0665", "1_000"])
@pytest.mark.parametrize("name", ["width", "height"])
def test_parse_transform_rejects_bad_dimensions(name: str, value: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_transform({name: [value]})
    assert info.value.status == 400


@pytest.mark.parametrize("args", [
    {"width": ["10", "20"]},
    {"height": ["10", "10"]},
    {"format": ["png", "png"]},
    {"format": ["bmp"]},
    {"format": ["jpeg "]},
    {"format": [""]},
    {"format": ["svg"]},
    {"width": [b"\xff"]},
])
def test_parse_transform_rejects(args: dict) -> None:
    with pytest.raises(BadRequest):
        parse_transform(args)


def test_cache_key_is_canonical() -> None:
    assert TransformSpec(160, None, "webp").cache_key() == "w160-h-fwebp"
    assert TransformSpec(None, 60, None).cache_key() == "w-h60-f"
    assert parse_transform({"width": ["0050"], "height": ["50"], "format": ["jpeg"]}).cache_key() == \
        parse_transform({"format": ["jpeg"], "height": ["50"], "width": ["50"]}).cache_key()



@pytest.mark.parametrize("query", ["form%61t=auto", "width=20&%66ormat=webp", "format+=auto", "t%73ig=00",
                                   "width%3D20"])
def test_a_parameter_name_spelt_with_an_escape_is_refused(query: str) -> None:
    """Issue 25 finding 6: a cache in front reads names as written; the server must too."""
    with pytest.raises(BadRequest) as refused:
        query_arguments(query)
    assert refused.value.code == "INVALID_PARAMETER_NAME"


def test_values_may_be_escaped_and_names_are_kept_as_written() -> None:
    assert query_arguments("format=%61uto&width=20&v=a+b&flag") == {
        "format": ["auto"], "width": ["20"], "v": ["a b"], "flag": [""]}
    assert parse_transform(query_arguments("width=20&format=%77ebp")) == TransformSpec(20, None, "webp")


def test_a_query_is_remembered_only_when_short() -> None:
    """Readings are kept for queries up to REMEMBERED_QUERY_MAX characters: a long ``v`` (the
    cache-buster, any length) is read each time, so 4,096 of them cannot hold 64 MB."""
    from mediasrv.images import spec

    spec.forget_queries()
    short = "width=320"
    assert spec.read_query(short) is spec.read_query(short)  # the second is the kept reading
    long = "width=320&v=" + "x" * spec.REMEMBERED_QUERY_MAX
    first, second = spec.read_query(long), spec.read_query(long)
    assert first == second and first is not second
    assert first.spec == spec.read_query(short).spec
