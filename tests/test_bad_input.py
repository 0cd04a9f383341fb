"""Bad input to a compiled model: an InputError that names the input and dim, expected vs got."""

import time

import pytest
import torch
import transformers
from tiny_models import tiny_bert

import anyshape


@pytest.fixture(scope="module")
def bert():
    model = tiny_bert(max_position_embeddings=40)
    ids, mask = torch.randint(0, 50, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    return model, anyshape.optimize(model, {"input_ids": ids, "attention_mask": mask})


def test_inputs_that_must_share_sequence_length(bert):
    _, opt = bert
    ids, mask = torch.randint(0, 50, (3, 12)), torch.ones(3, 17, dtype=torch.long)
    with pytest.raises(anyshape.InputError) as err:
        opt(input_ids=ids, attention_mask=mask)
    msg = str(err.value)
    assert "input 'attention_mask' dim 1: expected 12" in msg and "got 17" in msg
    assert "input 'input_ids' dim 1" in msg  # where the expectation came from


def test_sequence_longer_than_the_model_supports(bert):
    _, opt = bert
    ids, mask = torch.randint(0, 50, (1, 41)), torch.ones(1, 41, dtype=torch.long)
    with pytest.raises(anyshape.InputError, match=r"dim 1 = 41 is outside the range .*\[0, 40\]"):
        opt(input_ids=ids, attention_mask=mask)


def test_wrong_dtype_names_the_input(bert):
    _, opt = bert
    ids = torch.randint(0, 50, (2, 5)).to(torch.int32)
    with pytest.raises(anyshape.InputError, match="input 'input_ids' has dtype i32, expected i64"):
        opt(input_ids=ids, attention_mask=torch.ones(2, 5, dtype=torch.long))


def test_non_tensor_input_is_named(bert):
    _, opt = bert
    with pytest.raises(anyshape.InputError, match="input 'attention_mask' must be a tensor"):
        opt(input_ids=torch.randint(0, 50, (2, 5)), attention_mask=[[1] * 5] * 2)


def test_valid_edge_shapes_still_match_eager(bert):
    model, opt = bert
    for b, s in [(1, 1), (1, 40), (5, 3)]:
        ids, mask = torch.randint(0, 50, (b, s)), torch.ones(b, s, dtype=torch.long)
        with torch.no_grad():
            torch.testing.assert_close(
                opt(input_ids=ids, attention_mask=mask).last_hidden_state,
                model(input_ids=ids, attention_mask=mask).last_hidden_state,
                rtol=1e-4,
                atol=1e-4,
            )


def _small_vit():
    """A one-layer ViT for 32 px images of 8 px patches (16 patches), random weights."""
    cfg = transformers.ViTConfig(
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    return transformers.ViTModel(cfg, add_pooling_layer=False).eval()


def test_branch_taken_only_for_the_example_size_is_checked_and_compiled_again():
    # ViT skips position-embedding interpolation when the image has the config size:
    # torch.export records that as a guard, which the prologue must check; a call that
    # fails it is compiled again for its own case (eager runs it), not refused.
    model = _small_vit()
    opt = anyshape.optimize(
        model, {"pixel_values": torch.randn(2, 3, 32, 32), "interpolate_pos_encoding": True}
    )
    # (the guard on the patch grid, floordiv(s, 8)**2 == 16, gives the grid's size: the
    # graph's products over it verify without guards of their own, compiled whole)
    assert "0 run in PyTorch" in str(opt.explain())
    recompiled = anyshape.stats()["guard_recompilations"]
    big = torch.randn(2, 3, 58, 58)
    with torch.no_grad():
        torch.testing.assert_close(
            opt(pixel_values=big, interpolate_pos_encoding=True).last_hidden_state,
            model(pixel_values=big, interpolate_pos_encoding=True).last_hidden_state,
            rtol=1e-4,
            atol=1e-4,
        )
    assert anyshape.stats()["guard_recompilations"] == recompiled + 1
    assert "torch.export guard" in str(opt.explain())  # the variant names the guard
    with pytest.raises(anyshape.InputError, match="interpolate_pos_encoding' was True"):
        opt(pixel_values=torch.randn(2, 3, 32, 32), interpolate_pos_encoding=False)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            opt(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state,
            model(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state,
            rtol=1e-4,
            atol=1e-4,
        )


class FramesByParity(torch.nn.Module):
    """A branch on the parity of a size computed from the input (frames of a strided
    convolution): torch.export guards ``mod(frames, 2) != 1``, a decision, not its
    assumption that sizes are not 0 or 1."""

    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Conv1d(1, 8, 10, stride=5)

    def forward(self, wave):
        h = self.encode(wave[:, None]).transpose(1, 2)  # (length - 10) // 5 + 1 frames
        return h[:, ::2] if h.shape[1] % 2 == 1 else h


def test_a_branch_on_the_parity_of_a_derived_size_is_guarded():
    torch.manual_seed(0)
    model = FramesByParity().eval()
    opt = anyshape.optimize(model, (torch.randn(2, 19),), model_cache=False)  # 2 frames
    with torch.no_grad():
        for length in (19, 24, 29, 200, 15, 10):  # 2, 3, 4, 39, 2 and 1 frames
            x = torch.randn(2, length)
            got, want = opt(x), model(x)
            assert got.shape == want.shape, (length, got.shape, want.shape)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class PaddedToSevens(torch.nn.Module):
    """The width padded to a multiple of 7 (Swin's windows): torch guards that the padded
    size over 7 is not 0, its assumption about sizes, though the size holds a remainder."""

    def forward(self, x):
        w = x.shape[-1]
        x = torch.nn.functional.pad(x, (0, (7 - w % 7) % 7))
        return x.reshape(x.shape[0], -1, 7).sum(-1)


def test_a_size_holding_a_remainder_is_not_a_parity_decision():
    model = PaddedToSevens()
    before = anyshape.stats()
    opt = anyshape.optimize(model, (torch.randn(2, 10),), model_cache=False)
    for width in range(0, 30):
        x = torch.randn(2, width)
        torch.testing.assert_close(opt(x), model(x))
    after = anyshape.stats()
    assert after["compilations"] - before["compilations"] == 1
    assert after["guard_recompilations"] == before["guard_recompilations"]


def test_a_call_a_variant_refuses_goes_on_to_a_variant_of_its_own():
    """ViT skips interpolating its position embeddings for a square image of the
    configured patch count: the variant compiled for a square call makes the image's two
    dims one. A later call of that patch count but not square fails the first graph's
    guard too, and the square variant's dims: it gets a variant of its own."""
    vit = _small_vit()

    class Interpolated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.vit = vit

        def forward(self, pixel_values):
            out = self.vit(pixel_values=pixel_values, interpolate_pos_encoding=True)
            return out.last_hidden_state

    torch.manual_seed(0)
    model = Interpolated().eval()
    with torch.no_grad():
        opt = anyshape.optimize(model, (torch.randn(2, 3, 40, 56),), model_cache=False)
        fallbacks = anyshape.stats()["fallback_ops"]
        for hw in [(32, 32), (16, 64), (32, 32), (64, 16), (48, 40)]:
            x = torch.randn(1, 3, *hw)
            torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    # (each variant compiled whole: the non-square one's 16 patches, a product of two
    # sizes torch guards, are proven 17 tokens with the class token)
    assert anyshape.stats()["fallback_ops"] == fallbacks


def test_an_empty_slice_of_a_derived_length_is_compiled_not_refused():
    """``a[..., :-1] @ b``: torch derives ``a.shape[-1] == b.shape[0] + 1``, true for every
    width of at least 1. At width 0 eager's slice is empty, b has no rows, and the product
    is zeros: that call gets a variant of its own. Contradicting dims stay refused, at
    once where no size is 0, and after eager refuses them too where one is."""

    class ShiftedProduct(torch.nn.Module):
        def forward(self, a, b):
            return a[..., :-1] @ b

    model = ShiftedProduct()
    opt = anyshape.optimize(model, (torch.randn(3, 6), torch.randn(5, 4)))
    for k in [6, 1, 2]:
        a, b = torch.randn(3, k), torch.randn(k - 1, 4)
        torch.testing.assert_close(opt(a, b), model(a, b))
    recompiled = anyshape.stats()["guard_recompilations"]
    a, b = torch.randn(3, 0), torch.randn(0, 4)
    torch.testing.assert_close(opt(a, b), model(a, b))
    assert anyshape.stats()["guard_recompilations"] == recompiled + 1
    torch.testing.assert_close(opt(a, b), model(a, b))  # (the variant serves it again)
    assert anyshape.stats()["guard_recompilations"] == recompiled + 1
    with pytest.raises(anyshape.InputError, match="input 'a' dim 1: expected 8") as bad:
        opt(torch.randn(3, 6), torch.randn(7, 4))
    assert not bad.value.at_size_edge
    with pytest.raises(anyshape.InputError, match="capturing the model again"):
        opt(torch.randn(3, 0), torch.randn(5, 4))
    assert anyshape.stats()["guard_recompilations"] == recompiled + 1
    # The same bad call again is refused at once, without capturing the model again.
    start = time.perf_counter()
    for _ in range(20):
        with pytest.raises(anyshape.InputError, match="capturing the model again"):
            opt(torch.randn(3, 0), torch.randn(5, 4))
    assert time.perf_counter() - start < 1.0  # (one capture takes about a second)


def test_a_refused_call_is_remembered_with_its_keywords():
    """The refusal memory tells calls apart by their keyword names: the same tensors
    given to the other keyword are another call (here a valid one)."""

    class ShiftedProduct(torch.nn.Module):
        def forward(self, x, y):
            return x[..., :-1] @ y

    model = ShiftedProduct()
    opt = anyshape.optimize(model, {"x": torch.randn(3, 6), "y": torch.randn(5, 4)})
    p, q = torch.randn(0, 0), torch.randn(0, 5)
    with pytest.raises(RuntimeError):  # (eager refuses it too)
        model(x=q, y=p)
    with pytest.raises(anyshape.InputError, match="capturing the model again"):
        opt(x=q, y=p)
    torch.testing.assert_close(opt(y=q, x=p), model(y=q, x=p))


def test_a_size_one_broadcast_against_a_size_zero_is_compiled():
    """``x + y``: torch makes the two rows one symbol; eager broadcasts a 1 against a 0."""

    class Sum(torch.nn.Module):
        def forward(self, x, y):
            return x + y

    model = Sum()
    opt = anyshape.optimize(model, (torch.randn(3, 4), torch.randn(3, 4)))
    for a, b in [((1, 4), (0, 4)), ((0, 4), (1, 4)), ((0, 4), (0, 4))]:
        x, y = torch.randn(*a), torch.randn(*b)
        torch.testing.assert_close(opt(x, y), model(x, y))
