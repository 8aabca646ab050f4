"""Profiles measured on one device type, used for cluster types that compute alike.

A profile directory names its device types (``placements-a100.csv``); a cluster may split one
of them into types that differ only where the profiled jobs do not notice, e.g. ``a100-80g`` and
``a100-40g`` for jobs that fit in 40 GB. :class:`AliasedProfiles` serves the measurements of the
profiled type under each alias, so those jobs run on either kind of node.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

from shoal.backends.sim.profile import ApplicationProfile, ProfileLibrary
from shoal.spec.errors import SpecError


class AliasedProfiles:
    """A :class:`ProfileLibrary` whose applications also answer for ``aliases`` (alias ->
    profiled device type)."""

    def __init__(self, library: ProfileLibrary, aliases: Mapping[str, str]):
        self.library = library
        self.root = library.root
        self.aliases = dict(aliases)
        self._apps: dict[str, ApplicationProfile] = {}

    def names(self) -> list[str]:
        return self.library.names()

    def get(self, name: str) -> ApplicationProfile:
        app = self._apps.get(name)
        if app is None:
            base = self.library.get(name)
            missing = sorted({t for t in self.aliases.values() if t not in base.devices})
            if missing:
                raise SpecError(
                    f"{name} has no profile for {missing} to alias; profiled: "
                    f"{base.device_types}",
                    field="profiles",
                )
            app = copy.copy(base)
            app.devices = {**base.devices,
                           **{alias: base.devices[t] for alias, t in self.aliases.items()}}
            self._apps[name] = app
        return app
