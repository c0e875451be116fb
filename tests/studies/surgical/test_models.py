"""The surgical study's models (fedcare.studies.surgical.models): torchvision's AlexNet and VGG13
with 6 outputs, normalising inside; a weights file fills every layer but the last, and a wrong
one is refused by name."""

from __future__ import annotations

import pytest
import torch
import torchvision

from fedcare.studies.surgical.models import WeightsError, build_model, load_weights


def test_the_model_is_torchvisions_with_6_outputs_and_normalises_inside(tmp_path):
    for name, reference in (("alexnet", torchvision.models.alexnet), ("vgg13", torchvision.models.vgg13)):
        torch.manual_seed(3)
        theirs = reference(weights=None, num_classes=6).state_dict()
        torch.manual_seed(3)
        ours = build_model(name).state_dict()
        assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    model = build_model("alexnet", 0.125, 16).eval()
    assert "mean" not in model.state_dict() and "std" not in model.state_dict()  # never in a message
    x = torch.rand(3, 3, 64, 96)
    out = model(x)
    assert out.shape == (3, 6)
    mean, std = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1), torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    plain = model.classifier(torch.flatten(model.avgpool(model.features((x - mean) / std)), 1))
    assert torch.allclose(out, plain)
    with torch.no_grad():  # scoring in chunks gives the same outputs
        model.inference_batch = 2
        assert torch.allclose(model(x), plain.detach(), atol=1e-6)


def test_a_weights_file_fills_every_layer_but_the_last_and_a_wrong_one_is_refused(tmp_path):
    torch.manual_seed(0)
    source = build_model("alexnet", 0.125, 16)
    source.classifier[6] = torch.nn.Linear(16, 1000)  # ImageNet's 1000 classes, as torchvision's files
    path = tmp_path / "alexnet-imagenet.pth"
    torch.save(source.state_dict(), path)
    torch.manual_seed(1)
    model = build_model("alexnet", 0.125, 16)
    last = model.classifier[6].weight.detach().clone()
    loaded = load_weights(model, path)
    assert "classifier.6.weight" not in loaded and len(loaded) == len(model.state_dict()) - 2
    assert all(torch.equal(model.state_dict()[k], source.state_dict()[k]) for k in loaded)
    assert torch.equal(model.classifier[6].weight, last)  # the 6-output layer keeps its own init
    with pytest.raises(WeightsError, match=r"alexnet-imagenet.pth: 'features.0.weight' has shape \(8, 3, 11, 11\) in "
                                           r"the file but \(16, 3, 11, 11\) in the model"):
        load_weights(build_model("alexnet", 0.25, 16), path)
    vgg = tmp_path / "vgg.pth"
    torch.save(build_model("vgg13", 0.125, 16).state_dict(), vgg)
    with pytest.raises(WeightsError, match=r"vgg.pth: 'features.0.weight' has shape \(8, 3, 3, 3\)"):
        load_weights(build_model("alexnet", 0.125, 16), vgg)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(WeightsError, match="junk.pth: not a PyTorch state-dict file"):
        load_weights(model, tmp_path / "junk.pth")
