"""What every dataset module shares: the base class of data errors, the marker that tells a
generated copy from a real one, and the Tobis thesis's UNBC-McMaster subject groups.

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

# The Tobis thesis's fixed subject split ([code]); subject 101 has no pain frames and is left
# out. The pain study's defaults and the synthetic pain generator both use it.
THESIS_GROUP1 = (42, 47, 49, 66, 95, 97, 103, 106, 108, 121, 123, 124)  # pretraining
THESIS_GROUP2 = (43, 48, 52, 59, 64, 80, 92, 96, 107, 109, 115, 120)  # training and evaluation
