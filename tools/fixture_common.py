"""What the PyTorch fixture scripts (make_gpt2_fixtures.py, make_llama_fixtures.py) share: the
batch in llm.c's convention, the mean cross-entropy, and the AdamW trajectory memfit's parity
tests replay (support/torch_fixture.cpp uses the same lr, betas, eps and decay groups)."""

import torch
import torch.nn.functional as F


def make_batch(batch, seq, vocab, seed):
    """One flat random sequence of B*T+1 tokens; row b = flat[b*T : b*T+T], targets shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    flat = torch.randint(0, vocab, (batch * seq + 1,), generator=gen, dtype=torch.int64)
    tokens = torch.stack([flat[b * seq: b * seq + seq] for b in range(batch)])
    targets = torch.stack([flat[b * seq + 1: b * seq + seq + 1] for b in range(batch)])
    return tokens, targets


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def adamw_losses(model, tokens, targets, steps):
    """Loss before each of `steps` AdamW steps, then after the last (decay 0.1 on ndim >= 2)."""
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        _, loss = loss_of(model, tokens, targets)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    with torch.no_grad():
        losses.append(loss_of(model, tokens, targets)[1].item())
    return torch.tensor(losses, dtype=torch.float32)


def reference_values(model, tokens, targets, adamw_steps):
    """The fixture's expected tensors: logits, loss, grad.<name> of every parameter, then
    losses_adamw (the AdamW steps update the model). Exits when a sanity check fails."""
    import sys
    model.zero_grad(set_to_none=True)
    logits, loss = loss_of(model, tokens, targets)
    loss.backward()
    expected = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(())}
    for name, p in model.named_parameters():
        if p.grad is None:
            sys.exit(f"no gradient for {name}")
        expected["grad." + name] = p.grad.detach().clone().contiguous()
    losses = adamw_losses(model, tokens, targets, adamw_steps)
    if abs(losses[0].item() - loss.item()) > 1e-6:
        sys.exit(f"AdamW start loss {losses[0].item()} != loss {loss.item()}")
    if not all(losses[i + 1] < losses[i] for i in range(len(losses) - 1)):
        sys.exit(f"loss does not decrease over AdamW steps: {losses.tolist()}")
    expected["losses_adamw"] = losses
    return expected
