"""What every dataset module shares: the base class of data errors, and the marker that tells a
generated copy from a real one.

Kept free of heavy imports (no OpenCV, no torch): the config loader and the CLI import it."""

from __future__ import annotations

from fedcare.errors import UserError


class DataError(UserError, ValueError):
    """Input data that cannot be used: a missing or malformed dataset copy, an unreadable
    file, a label without its image. The message names the path and the problem; the CLI
    prints it as one line (no traceback)."""


# A generator writes this file at the root of every synthetic copy; loaders and reports look
# for it, so a synthetic number is never mistaken for a real one.
SYNTHETIC_MARKER = "fedcare-synthetic.json"

# The most a synthetic copy may ask for (each generator, and the experiment files that generate
# one, refuse more, naming the option): past these a mistyped exponent asks for terabytes
# (`--frame-scale 1e9` was a 23 TiB allocation).
MAX_SCALE = 10.0  # frame_scale, scale: ten times the real dataset's counts
MAX_IMAGE_SIZE = 1024  # pixels a side
MAX_IDENTITIES = 100_000  # people drawn (CelebA has 10,177)
MAX_IMAGES_PER_IDENTITY = 1000
