"""A small Llama-shaped decoder whose attention reads and writes a paged KV cache, for
kv_sharing.py's engines (--model): its weights live in one gmsfs store that every engine
maps (gmsfs.torch.load_or_publish), its K and V in each engine's gmsfs.Pages.

The cache is the pages' range seen as token slots: slot s holds, for every layer, that
token's K and V ([layers, 2, heads, head_dim]); a block of the engine's block manager is
TOKENS_PER_BLOCK consecutive slots, so a token at position p of a sequence whose blocks
are b0, b1, ... lies in slot b[p // T] * T + p % T.  Each decode step runs the batch of
running sequences through every layer: their new K and V are written into their slots,
and attention gathers every earlier token's from the cache (as a paged-attention kernel
does, in plain PyTorch).  Weights: RMSNorm, fused QKV, rotary positions, SwiGLU MLP,
tied embeddings, deterministic (seeded) instead of a checkpoint's."""
import math

import torch


class Shape:
    def __init__(self, hidden=1024, heads=8, layers=8, vocab=8192, ffn=None):
        if hidden % heads:
            raise ValueError("hidden %d is not a multiple of heads %d" % (hidden, heads))
        self.hidden, self.heads, self.layers, self.vocab = hidden, heads, layers, vocab
        self.head_dim = hidden // heads
        self.ffn = ffn or (hidden * 8 // 3 + 127) // 128 * 128

    def params(self):
        layer = self.hidden * (2 + 4 * self.hidden + 3 * self.ffn)
        return self.vocab * self.hidden + self.layers * layer + self.hidden

    def token_bytes(self, dtype):
        """One token's K and V over every layer."""
        return self.layers * 2 * self.hidden * torch.tensor([], dtype=dtype).element_size()


class Layer(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.ln1 = torch.nn.Parameter(torch.ones(s.hidden))
        self.qkv = torch.nn.Linear(s.hidden, 3 * s.hidden, bias=False)
        self.o = torch.nn.Linear(s.hidden, s.hidden, bias=False)
        self.ln2 = torch.nn.Parameter(torch.ones(s.hidden))
        self.gate_up = torch.nn.Linear(s.hidden, 2 * s.ffn, bias=False)
        self.down = torch.nn.Linear(s.ffn, s.hidden, bias=False)


class Decoder(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.shape = s
        self.embed = torch.nn.Embedding(s.vocab, s.hidden)
        self.layers = torch.nn.ModuleList(Layer(s) for _ in range(s.layers))
        self.norm = torch.nn.Parameter(torch.ones(s.hidden))


def init_weights(model, seed=46):
    """What a checkpoint would load: the same numbers in every process that publishes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(p.shape[-1])))


def _rms(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def _rotate(x, pos, s):
    """Rotary positions: x [n, heads, head_dim] at positions pos [n]."""
    half = s.head_dim // 2
    freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = pos.float()[:, None] * freq[None, :]
    cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class PagedDecoder:
    """model over cache (a tensor of the pages' whole range, any dtype's bytes)."""

    def __init__(self, model, cache, tokens_per_block):
        self.m, self.s, self.tpb = model, model.shape, tokens_per_block
        s = self.s
        dtype = model.embed.weight.dtype
        self.kv = cache.view(torch.uint8).view(dtype).view(-1, s.layers, 2, s.heads, s.head_dim)

    def slot(self, blocks, pos):
        return blocks[pos // self.tpb] * self.tpb + pos % self.tpb

    @torch.no_grad()
    def step(self, seqs):
        """One forward of a batch: seqs is [(tokens, first position, blocks)] whose tokens
        are new (a prompt, or a decode step's one token); their K and V are written and
        each sequence attends to its positions 0..last.  Returns each sequence's logits for
        its next token ([len(seqs), vocab], float32)."""
        m, s, dev = self.m, self.s, self.kv.device
        toks, pos, seq_of, past = [], [], [], []
        for i, (t, first, blocks) in enumerate(seqs):
            toks += t
            pos += range(first, first + len(t))
            seq_of += [i] * len(t)
            past.append([self.slot(blocks, p) for p in range(first + len(t))])
        n = len(toks)
        longest = max(len(p) for p in past)
        # Each new token's view of the cache: its sequence's slots, padded with its own
        # first slot (masked), and a mask of the positions it may see (causal).
        table = torch.tensor([p + [p[0]] * (longest - len(p)) for p in past], dtype=torch.long, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        seq_t = torch.tensor(seq_of, dtype=torch.long, device=dev)
        idx = table[seq_t]  # [n, longest]
        see = torch.arange(longest, device=dev)[None, :] <= pos_t[:, None]
        new = torch.tensor([self.slot(seqs[i][2], p) for i, p in zip(seq_of, pos)], dtype=torch.long, device=dev)
        x = m.embed.weight[torch.tensor(toks, dtype=torch.long, device=dev)]
        for li, layer in enumerate(m.layers):
            h = _rms(x, layer.ln1)
            q, k, v = (h @ layer.qkv.weight.t()).view(n, 3, s.heads, s.head_dim).unbind(1)
            q, k = _rotate(q, pos_t, s), _rotate(k, pos_t, s)
            self.kv[new, li, 0] = k
            self.kv[new, li, 1] = v
            keys, vals = self.kv[idx, li, 0], self.kv[idx, li, 1]  # [n, longest, heads, head_dim]
            score = torch.einsum("nhd,nmhd->nhm", q.float(), keys.float()) / math.sqrt(s.head_dim)
            score = score.masked_fill(~see[:, None, :], float("-inf")).softmax(-1)
            att = torch.einsum("nhm,nmhd->nhd", score, vals.float()).to(x.dtype).reshape(n, s.hidden)
            x = x + att @ layer.o.weight.t()
            h = _rms(x, layer.ln2)
            gate, up = (h @ layer.gate_up.weight.t()).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ layer.down.weight.t()
        last = torch.tensor([i for i in range(n) if i + 1 == n or seq_of[i + 1] != seq_of[i]], device=dev)
        return (_rms(x[last], m.norm) @ m.embed.weight.t()).float()


if __name__ == "__main__":  # the weights' MiB in fp16 (a mount's budget is the cache's and these)
    print(-(-Shape().params() * 2 // (1 << 20)))
