"""The install command to print when an optional extra is missing, one that works from where
looptrace was installed: looptrace is installed from a clone or a wheel, so ``pip install
'looptrace[server]'`` would name a package the user's index may not have."""

from __future__ import annotations

import json
import re
import shlex
import sys
from importlib import metadata
from urllib.parse import unquote, urlsplit

__all__ = ["install_hint"]


def install_hint(extra: str) -> str:
    """``pip install '<the folder it came from>[extra]'`` for a package installed from a
    folder (a clone, editable or not); otherwise the extra's own requirements by name, which
    install from any index."""
    pip = f"{shlex.quote(sys.executable)} -m pip install"
    try:
        dist = metadata.distribution("looptrace")
    except metadata.PackageNotFoundError:
        return f"{pip} 'looptrace[{extra}]'"
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        origin = {}
    url = urlsplit(str(origin.get("url", "")))
    if "dir_info" in origin and url.scheme == "file":
        return f"{pip} {shlex.quote(unquote(url.path) + f'[{extra}]')}"
    wanted = []
    for requirement in dist.requires or ():
        spec, _, marker = requirement.partition(";")
        if re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            wanted.append(shlex.quote(spec.strip().replace(" ", "")))
    return f"{pip} {' '.join(wanted)}" if wanted else f"{pip} 'looptrace[{extra}]'"
