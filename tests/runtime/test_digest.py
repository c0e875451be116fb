"""The canonical digests (`fedcare.runtime.digest`): a message's digest names its model whatever
the dicts' order, the device or the memory layout, and changes with any name, dtype, shape,
value or scalar; the code digest changes with any source file of the package."""

import pytest
import torch

from fedcare.algorithms.messages import Message
from fedcare.runtime.digest import code_digest, message_digest, package_digest


def _message() -> Message:
    g = torch.Generator().manual_seed(0)
    return Message({"b.weight": torch.randn(3, 4, generator=g), "a.bias": torch.randn(4, generator=g),
                    "n": torch.tensor(7), "h": torch.randn(2, generator=g).to(torch.bfloat16)},
                   {"num_examples": 12.0, "train_loss": 0.25})


def test_the_digest_does_not_depend_on_the_order_of_the_tensors_or_scalars():
    m = _message()
    reordered = Message(dict(reversed(list(m.tensors.items()))), dict(reversed(list(m.scalars.items()))))
    assert list(reordered.tensors) != list(m.tensors)
    assert message_digest(reordered) == message_digest(m)
    assert len(message_digest(m)) == 64 and int(message_digest(m), 16) >= 0


def test_the_digest_does_not_depend_on_the_memory_layout():
    m = _message()
    weight = m.tensors["b.weight"]
    transposed_twice = weight.t().contiguous().t()  # same values, column-major strides
    assert not transposed_twice.is_contiguous()
    assert message_digest(Message({**m.tensors, "b.weight": transposed_twice}, m.scalars)) == message_digest(m)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_digest_does_not_depend_on_the_device():
    m = _message()
    on_gpu = Message({k: v.to("cuda") for k, v in m.tensors.items()}, dict(m.scalars))
    assert message_digest(on_gpu) == message_digest(m)


@pytest.mark.parametrize("change", ["value", "dtype", "shape", "name", "scalar", "new scalar", "dropped tensor"])
def test_the_digest_changes_with_any_name_dtype_shape_value_or_scalar(change):
    m = _message()
    t, s = dict(m.tensors), dict(m.scalars)
    if change == "value":
        w = t["b.weight"].clone()
        w[1, 2] = torch.nextafter(w[1, 2], torch.tensor(10.0))  # one float a single step away
        t["b.weight"] = w
    elif change == "dtype":
        t["b.weight"] = t["b.weight"].double()
    elif change == "shape":
        t["b.weight"] = t["b.weight"].reshape(4, 3)  # the same bytes, another shape
    elif change == "name":
        t["c.weight"] = t.pop("b.weight")
    elif change == "scalar":
        s["train_loss"] = 0.26
    elif change == "new scalar":
        s["dp_epsilon"] = 1.0
    else:
        del t["a.bias"]
    assert message_digest(Message(t, s)) != message_digest(m)


def test_the_code_digest_covers_every_source_file_of_a_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    (package / "sub" / "demo.toml").write_text("a = 1\n")
    (package / "notes.txt").write_text("not code")
    before = package_digest(package)
    (package / "notes.txt").write_text("changed, not code")
    assert package_digest(package) == before
    (package / "sub" / "demo.toml").write_text("a = 2\n")
    assert package_digest(package) != before
    (package / "sub" / "demo.toml").write_text("a = 1\n")
    assert package_digest(package) == before
    (package / "sub" / "__init__.py").write_text("")  # a file added
    assert package_digest(package) != before


def test_the_installed_packages_code_digest_is_computed_once_per_process():
    import fedcare
    from pathlib import Path

    assert code_digest() == package_digest(Path(fedcare.__file__).parent)
    assert code_digest.cache_info().currsize == 1
