"""Which muster this is: the package's version and a digest of its code.

A version alone does not say the code is the same (a rebuilt image, a patched install, a checkout
between releases): what a snapshot holds is the state layout of the code that wrote it, so a start
compares code digests before loading one, and the replay bench keys its cached log on the same
digest.
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.kernel.events import PolicyApplied
    from shared.kernel.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
"""The folder holding the ``shared`` and ``services`` packages (a checkout or site-packages)."""


def muster_version() -> str:
    try:
        return metadata.version("muster")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree without install
        return "unknown"


@cache
def code_digest(*extra: Path) -> str:
    """Equal only for the same Python source in ``services`` and ``shared`` (and ``extra`` files)."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted([*ROOT.glob("services/**/*.py"), *ROOT.glob("shared/**/*.py"), *extra]):
        digest.update(path.resolve().relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def policy_applied(policy: "Policy", services: tuple[str, ...], *, after: str | None = None) -> "PolicyApplied":
    """The log's record that ``services`` decide with ``policy`` from here on, under this muster's code:
    what a replay reads the policy from, and tells other code from an altered log by."""
    from shared.kernel.events import PolicyApplied

    return PolicyApplied(services=services, policy=policy.as_json(), policy_digest=policy.digest(),
                         code_digest=code_digest(), muster_version=muster_version(), after=after)
