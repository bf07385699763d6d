"""The fuzzer's generator against kafka-python's own decoder (no broker): unmutated frames of
every advertised API and version must decode, or the fuzzer would mostly test the decoder's
first check."""

from __future__ import annotations

import random

import pytest

from ads_broker.protocol.apis import SUPPORTED_APIS, decode_request
from tests.fuzz.batches import BatchFactory, batch_problem, bomb
from tests.fuzz.frames import FrameSource, FuzzOptions, RequestGenerator


@pytest.mark.parametrize("api_key", sorted(SUPPORTED_APIS))
def test_generated_frames_decode_for_every_advertised_version(api_key: int) -> None:
    cls, lo, hi = SUPPORTED_APIS[api_key]
    rng = random.Random(api_key)
    gen = RequestGenerator(rng, FuzzOptions(internal_topics=True), BatchFactory(rng, FuzzOptions()))
    for version in range(lo, hi + 1):
        for i in range(20):
            data, spans = gen.frame(cls, version, correlation_id=i)
            req = decode_request(data[4:])
            assert (req.api_key, req.api_version, req.correlation_id) == (api_key, version, i)
            assert req.body is not None
            assert all(4 <= s.pos < len(data) for s in spans)


def test_frame_stream_is_reproducible_from_its_seed() -> None:
    a = FrameSource(1234).frames()
    b = FrameSource(1234).frames()
    for _ in range(300):
        fa, fb = next(a), next(b)
        assert (fa.data, fa.mutation) == (fb.data, fb.mutation)


def test_reference_batch_check() -> None:
    rng = random.Random(7)
    factory = BatchFactory(rng, FuzzOptions())
    for codec in range(5):
        assert batch_problem(factory.random_batch(codec)) is None
    lying = FuzzOptions(count_lies=True)
    liar = BatchFactory(random.Random(1), lying)
    problems = {liar._hole_batch("count_and_delta_lie", bytearray(factory.random_batch(0))) for _ in range(3)}
    assert all(batch_problem(b) is not None for b in problems)
    assert "bomb" in (batch_problem(bomb(4, 64)) or "")
