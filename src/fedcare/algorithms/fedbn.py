"""FedBN (Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021).

Every BatchNorm layer stays on its client: its affine weight and bias *and* its running
statistics (running_mean, running_var, num_batches_tracked). Everything else is averaged
as in FedAvg. BatchNorm is found by module type (`torch.nn.modules.batchnorm._BatchNorm`:
BatchNorm1d/2d/3d, SyncBatchNorm, the lazy variants), never by the substring "bn" in a name
as the PersonalizedFL code did (`if 'bn' not in key`): a Linear called `bn` is shared, a
BatchNorm called `norm` is not.

Local training is FedAvg's (plain SGD on every layer, BatchNorm included). The default
weighting is uniform, as FedBN's Algorithm 1 and the FedHealth 2 authors' code
(client_weights = 1/N); pass weighting="examples" for a size-weighted average.
Other normalisations (GroupNorm, LayerNorm, InstanceNorm) are not BatchNorm and are shared,
except the GroupNorm DP-SGD puts in a BatchNorm's place (`fedcare.privacy.dp_sgd.private_model`),
which stays private as the BatchNorm it stands in for: FedBN under DP-SGD keeps private
GroupNorm layers (statistics-free), not FedAvg's whole model.
"""

from __future__ import annotations

from torch import nn

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.split import ParameterSplit
from fedcare.algorithms.training import TrainSettings

BATCHNORM = nn.modules.batchnorm._BatchNorm
FEDBN_SPLIT = ParameterSplit(("",), (BATCHNORM,))


class FedBNClient(ClientHalf):
    """FedAvg's local training; BatchNorm tensors are the client's private state."""

    def __init__(self, settings: TrainSettings):
        super().__init__(settings, FEDBN_SPLIT)


class FedBNServer(ServerHalf):
    """Averages the non-BatchNorm tensors (the only ones it ever receives)."""

    def __init__(self, weighting: str = "uniform"):
        super().__init__(FEDBN_SPLIT, weighting)


def fedbn(settings: TrainSettings, weighting: str = "uniform") -> Algorithm:
    return Algorithm("fedbn", FedBNClient(settings), FedBNServer(weighting))
