"""Centralized training: the baseline that pools every client's data into one model.

It runs in the same engine as a single participant holding the pooled data; a round is one
epoch over it, so early stopping works per epoch as Keras's callback did."""

from dataclasses import replace

from fedcare.algorithms.base import Algorithm, ClientHalf, ServerHalf
from fedcare.algorithms.split import SHARE_ALL
from fedcare.algorithms.training import TrainSettings


def centralized(settings: TrainSettings) -> Algorithm:
    one_epoch = replace(settings, local_epochs=1)
    return Algorithm("centralized", ClientHalf(one_epoch, SHARE_ALL), ServerHalf(SHARE_ALL), pooled=True)
