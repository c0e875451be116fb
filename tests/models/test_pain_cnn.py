"""The pain study's CNN (thesis Table 4.2): its parameter count and the input sizes it takes."""

import pytest
import torch

from fedcare.models.pain_cnn import PainCNN, keras_parameter_count


def test_pain_cnn_has_the_thesis_parameter_count():
    # Table 4.2: 3,027,585 parameters at 215x215 (Keras counts BatchNorm moving statistics).
    assert keras_parameter_count(PainCNN(215)) == 3_027_585


@pytest.mark.parametrize("size", [16, 32, 215])
def test_pain_cnn_takes_its_input_size(size):
    model = PainCNN(size).eval()
    assert model(torch.zeros(2, 1, size, size)).shape == (2,)
