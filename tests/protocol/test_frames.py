"""protocol/frames.py names every struct of protocol/requests.py and protocol/serverframes.py,
so that ``from protocol.frames import X`` (the server, the clients, the docs) finds each one."""

from __future__ import annotations

import inspect

import msgspec

from protocol import frames, requests, serverframes


def _structs(module: object) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, msgspec.Struct)
        and value.__module__ == getattr(module, "__name__", None)
        and not name.startswith("_")
    }


def test_frames_names_every_request_and_frame() -> None:
    for part in (requests, serverframes):
        names = _structs(part)
        assert names, part
        missing = sorted(n for n in names if getattr(frames, n, None) is not getattr(part, n))
        assert missing == [], f"not named by protocol/frames.py: {missing}"
        assert names <= set(frames.__all__)


def test_every_request_is_in_the_union_and_every_frame_in_its_union() -> None:
    assert set(frames.REQUEST_TYPES.values()) == {getattr(requests, n) for n in _structs(requests)}
    assert set(frames.ServerFrame.__args__) == {getattr(serverframes, n) for n in _structs(serverframes)}
