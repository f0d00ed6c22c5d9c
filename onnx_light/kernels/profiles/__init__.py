"""Shipped processor profiles, kept as data: one JSON file per measured machine family.

Each file has a ``provenance`` (who measured what, where, with which command)
and a list of ``profiles`` in the form of
:func:`onnx_light.tuning.profiles.profile_from_dict`.
"""

from __future__ import annotations

import json
from importlib import resources

from ...tuning.profiles import ProcessorProfile, profile_from_dict

__all__ = ["processor_profiles"]


def processor_profiles() -> list[ProcessorProfile]:
    """Every profile in the package's ``*.json`` files, in file-name order."""
    profiles = []
    folder = resources.files(__name__)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        data = json.loads(entry.read_text(encoding="utf-8"))
        for number, item in enumerate(data["profiles"]):
            origin = f"{entry.name}#{number}"
            profile = profile_from_dict(item, origin)
            if not profile.provenance:
                profile = profile_from_dict({**item, "provenance": data["provenance"]}, origin)
            profiles.append(profile)
    return profiles
