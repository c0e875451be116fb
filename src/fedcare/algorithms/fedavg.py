"""FedAvg (McMahan et al.): every tensor is shared, BatchNorm statistics included, as the
pain thesis did. Averaging is weighted by example count or uniform (the thesis code's np.mean)."""

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.split import SHARE_ALL
from fedcare.algorithms.training import TrainSettings


def fedavg(settings: TrainSettings, weighting: str = "examples") -> Algorithm:
    return Algorithm("fedavg", ClientHalf(settings, SHARE_ALL), ServerHalf(SHARE_ALL, weighting))
