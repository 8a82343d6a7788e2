"""`meshtrain image build`: meshtrain's CPU image on this machine, without a registry."""

from __future__ import annotations

import argparse
import time


def register_image(sub: argparse._SubParsersAction) -> None:
    image = sub.add_parser("image", help="meshtrain's container image for local Docker jobs")
    actions = image.add_subparsers(dest="image_command", required=True)
    build = actions.add_parser(
        "build", help="build meshtrain's CPU image (meshtrain:<version>-cpu) with the local "
                      "Docker engine: an mmdebstrap Debian + torch base, or --base IMAGE")
    build.add_argument("--base", help="an image with python3, torch and pydantic to put "
                                      "meshtrain on (skips the Debian root file system)")
    build.add_argument("--tag", help="the tag to build (default meshtrain:<version>-cpu)")
    build.add_argument("--rebuild", action="store_true",
                       help="build even if the tag (and the base) already exist")
    build.set_defaults(handler=_build)


def _build(args: argparse.Namespace) -> int:
    from meshtrain.backends.docker.engine import check_engine
    from meshtrain.backends.docker.image import build_image, default_tag

    check_engine()
    tag = args.tag or default_tag()
    print(f"meshtrain: building {tag} ...", flush=True)
    start = time.monotonic()
    build_image(base=args.base, tag=tag, rebuild=args.rebuild)
    print(f"meshtrain: {tag} ready ({time.monotonic() - start:.0f} s)")
    return 0
