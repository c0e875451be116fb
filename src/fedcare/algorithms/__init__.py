"""The algorithm library: one module per algorithm, each a client half and a server half.

Server optimizers (FedAdam, FedYogi, FedAdagrad, FedAvgM, AdamW) wrap any averaging server
half: `with_server_optimizer(algorithm, "fedadam", eta=...)`.
"""

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.centralized import centralized
from fedcare.algorithms.fedap import fedap
from fedcare.algorithms.fedavg import fedavg
from fedcare.algorithms.fedbn import fedbn
from fedcare.algorithms.feddg import feddg
from fedcare.algorithms.feddyn import feddyn
from fedcare.algorithms.fedper import fedper
from fedcare.algorithms.fedprox import fedprox
from fedcare.algorithms.fedrep import fedrep
from fedcare.algorithms.local import local
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.perfedavg import perfedavg
from fedcare.algorithms.pfdl import pfdl
from fedcare.algorithms.qfedavg import qfedavg
from fedcare.algorithms.server_optimizers import with_server_optimizer

__all__ = [
    "Algorithm", "ClientHalf", "ServerHalf", "ClientState", "Message", "centralized", "fedap", "fedavg", "fedbn",
    "feddg", "feddyn", "fedper", "fedprox", "fedrep", "local", "perfedavg", "pfdl", "qfedavg", "with_server_optimizer",
]
