"""Every provider's development profile, found in its folder.

A provider whose class lives in ``onceonly/providers/<name>/`` (or any package)
is played by ``onceonly dev`` when that package has a ``profile`` module with a
``PROFILE`` (a :class:`~onceonly.providers.profile.DevProfile`). Nothing here
names a provider: adding one to :data:`~onceonly.providers.PROVIDER_CLASSES`
with a profile beside it is enough.
"""

from __future__ import annotations

import functools

from ..providers import PROVIDER_CLASSES, Provider
from ..providers.folder import companion
from ..providers.profile import DevProfile

__all__ = ["profile_for", "profiles"]


def _load(cls: type[Provider]) -> DevProfile | None:
    module = companion(cls, "profile")
    profile = getattr(module, "PROFILE", None)
    return profile if isinstance(profile, DevProfile) else None


@functools.cache
def profiles() -> dict[str, DevProfile]:
    """Route name -> profile, for every known provider that has one (in the
    order of :data:`~onceonly.providers.PROVIDER_CLASSES`)."""
    found: dict[str, DevProfile] = {}
    for route, cls in PROVIDER_CLASSES.items():
        profile = _load(cls)
        if profile is not None:
            found[route] = profile
    return found


def profile_for(provider: str) -> DevProfile | None:
    """The profile of `provider` (a route name such as ``stripe``), if it has one."""
    return profiles().get(provider)
