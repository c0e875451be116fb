"""The algorithm library: one module per algorithm, each a client half and a server half."""

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.centralized import centralized
from fedcare.algorithms.fedavg import fedavg
from fedcare.algorithms.local import local
from fedcare.algorithms.messages import ClientState, Message
from fedcare.algorithms.pfdl import pfdl

__all__ = ["Algorithm", "ClientHalf", "ServerHalf", "ClientState", "Message", "centralized", "fedavg", "local", "pfdl"]
