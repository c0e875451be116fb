"""Local-only models (the thesis's FL-CNN, the paper's LDL): clients share the initialisation
and never communicate again. Nothing is shared, so the whole model is private state."""

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.split import SHARE_NOTHING
from fedcare.algorithms.training import TrainSettings


def local(settings: TrainSettings) -> Algorithm:
    return Algorithm("local", ClientHalf(settings, SHARE_NOTHING), ServerHalf(SHARE_NOTHING))
