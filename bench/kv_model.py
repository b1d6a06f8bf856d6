"""A Llama decoder whose attention reads and writes a paged KV cache, for kv_sharing.py's
engines (--model): its weights live in one gmsfs store that every engine maps
(gmsfs.torch.load_or_publish), its K and V in each engine's gmsfs.Pages.

The model is transformers' LlamaForCausalLM where transformers is installed (the GPU
machine), else a module of the same parameter names and the same arithmetic (Decoder,
below; RMSNorm, rotary positions, SwiGLU, an untied head).  Weights are seeded, not a
checkpoint's.  check() holds the paged step to the model's own forward (transformers', or
the whole sequence recomputed here) before a run starts.

The cache is the pages' range seen as token slots: slot s holds, for every layer, that
token's K and V ([layers, 2, heads, head_dim]); a block of the engine's block manager is
T consecutive slots, so a token at position p of a sequence whose blocks are b0, b1, ...
lies in slot b[p // T] * T + p % T.  Each step runs a batch of sequences' new tokens
through every layer: their K and V are written into their slots, and attention gathers
every earlier token's from the cache (as a paged-attention kernel does, in PyTorch)."""
import math

import torch

THETA = 10000.0
EPS = 1e-6


class Shape:
    def __init__(self, hidden=1024, heads=8, layers=8, vocab=8192, ffn=None):
        if hidden % heads:
            raise ValueError("hidden %d is not a multiple of heads %d" % (hidden, heads))
        self.hidden, self.heads, self.layers, self.vocab = hidden, heads, layers, vocab
        self.head_dim = hidden // heads
        self.ffn = ffn or (hidden * 8 // 3 + 127) // 128 * 128

    def params(self):
        layer = self.hidden * (2 + 4 * self.hidden + 3 * self.ffn)
        return 2 * self.vocab * self.hidden + self.layers * layer + self.hidden

    def token_bytes(self, dtype):
        """One token's K and V over every layer."""
        return self.layers * 2 * self.hidden * torch.tensor([], dtype=dtype).element_size()


class _Norm(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))


def _linear(i, o):
    return torch.nn.Linear(i, o, bias=False)


class _Layer(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.self_attn = torch.nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, name, _linear(s.hidden, s.hidden))
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj, self.mlp.up_proj = _linear(s.hidden, s.ffn), _linear(s.hidden, s.ffn)
        self.mlp.down_proj = _linear(s.ffn, s.hidden)
        self.input_layernorm, self.post_attention_layernorm = _Norm(s.hidden), _Norm(s.hidden)


class Decoder(torch.nn.Module):
    """LlamaForCausalLM's parameters, by their names, without transformers."""

    def __init__(self, s):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(s.vocab, s.hidden)
        self.model.layers = torch.nn.ModuleList(_Layer(s) for _ in range(s.layers))
        self.model.norm = _Norm(s.hidden)
        self.lm_head = _linear(s.hidden, s.vocab)


def build(s, dtype, hf=None):
    """The model of shape s: transformers' Llama where hf is transformers, else Decoder."""
    if hf is None:
        return Decoder(s).to(dtype)
    cfg = hf.LlamaConfig(hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
                         num_attention_heads=s.heads, num_key_value_heads=s.heads, vocab_size=s.vocab,
                         rms_norm_eps=EPS, tie_word_embeddings=False, max_position_embeddings=4096)
    # Its rotary base is THETA, LlamaConfig's default (named differently across versions).
    return hf.LlamaForCausalLM(cfg).to(dtype).eval()


def init_weights(model, seed=46):
    """What a checkpoint would load: the same numbers in every process that publishes."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 / math.sqrt(p.shape[-1])))


def _rms(x, norm):
    """Llama's RMSNorm: in float32, cast back, then the weight."""
    y = x.float()
    return norm.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _rotate(x, pos, s):
    """Rotary positions (Llama's, halves rotated): x [n, heads, head_dim] at positions pos [n]."""
    half = s.head_dim // 2
    inv = 1.0 / THETA ** (torch.arange(0, s.head_dim, 2, device=x.device, dtype=torch.float32) / s.head_dim)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _qkv(layer, h, n, s):
    a = layer.self_attn
    return [(h @ p.weight.t()).view(n, s.heads, s.head_dim) for p in (a.q_proj, a.k_proj, a.v_proj)]


def _after_attention(layer, x, att):
    x = x + att @ layer.self_attn.o_proj.weight.t()
    h = _rms(x, layer.post_attention_layernorm)
    mlp = layer.mlp
    gate, up = h @ mlp.gate_proj.weight.t(), h @ mlp.up_proj.weight.t()
    return x + (torch.nn.functional.silu(gate) * up) @ mlp.down_proj.weight.t()


@torch.no_grad()
def whole_logits(model, s, tokens):
    """The next token's logits from the whole sequence with no cache (causal attention over
    every position): transformers' forward for its model, the same arithmetic here else."""
    dev = model.lm_head.weight.device
    ids = torch.tensor(tokens, dtype=torch.long, device=dev)
    if not isinstance(model, Decoder):
        return model(ids[None]).logits[0, -1].float()
    n = len(tokens)
    pos = torch.arange(n, device=dev)
    causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    x = model.model.embed_tokens.weight[ids]
    for layer in model.model.layers:
        q, k, v = _qkv(layer, _rms(x, layer.input_layernorm), n, s)
        q, k = _rotate(q, pos, s), _rotate(k, pos, s)
        score = torch.einsum("ihd,jhd->hij", q.float(), k.float()) / math.sqrt(s.head_dim)
        score = score.masked_fill(~causal, float("-inf")).softmax(-1)
        att = torch.einsum("hij,jhd->ihd", score, v.float()).to(x.dtype).reshape(n, s.hidden)
        x = _after_attention(layer, x, att)
    return (_rms(x[-1:], model.model.norm) @ model.lm_head.weight.t())[0].float()


class PagedDecoder:
    """model (of shape s) over cache (a tensor of the pages' whole range, any dtype's bytes)."""

    def __init__(self, model, s, cache, tokens_per_block):
        self.m, self.s, self.tpb = model, s, tokens_per_block
        dtype = model.lm_head.weight.dtype
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
        x = m.model.embed_tokens.weight[torch.tensor(toks, dtype=torch.long, device=dev)]
        for li, layer in enumerate(m.model.layers):
            q, k, v = _qkv(layer, _rms(x, layer.input_layernorm), n, s)
            q, k = _rotate(q, pos_t, s), _rotate(k, pos_t, s)
            self.kv[new, li, 0] = k
            self.kv[new, li, 1] = v
            keys, vals = self.kv[idx, li, 0], self.kv[idx, li, 1]  # [n, longest, heads, head_dim]
            score = torch.einsum("nhd,nmhd->nhm", q.float(), keys.float()) / math.sqrt(s.head_dim)
            score = score.masked_fill(~see[:, None, :], float("-inf")).softmax(-1)
            att = torch.einsum("nhm,nmhd->nhd", score, vals.float()).to(x.dtype).reshape(n, s.hidden)
            x = _after_attention(layer, x, att)
        last = torch.tensor([i for i in range(n) if i + 1 == n or seq_of[i + 1] != seq_of[i]], device=dev)
        return (_rms(x[last], m.model.norm) @ m.lm_head.weight.t()).float()


def check(model, s, prompt=40, steps=8, tpb=16, seed=7):
    """The paged step against the model's own forward, on a scratch cache of the model's
    device: a prompt prefilled, then decode steps, each step's logits beside the whole
    sequence's.  Returns the largest difference, relative to the logits' spread."""
    w = model.lm_head.weight
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(s.vocab, (prompt,), generator=g).tolist()
    nblocks = (prompt + steps) // tpb + 1
    blocks = torch.randperm(2 * nblocks, generator=g)[:nblocks].tolist()  # apart, out of order
    cache = torch.zeros(2 * nblocks * tpb * s.token_bytes(w.dtype), dtype=torch.uint8, device=w.device)
    d = PagedDecoder(model, s, cache, tpb)
    got, worst = d.step([(tokens, 0, blocks)])[0], 0.0
    for k in range(steps + 1):
        want = whole_logits(model, s, tokens)
        worst = max(worst, float((got - want).abs().max() / want.std()))
        if k < steps:
            tokens.append(int(want.argmax()))
            got = d.step([([tokens[-1]], len(tokens) - 1, blocks)])[0]
    return worst


if __name__ == "__main__":  # the weights' MiB in fp16 (a mount's budget is the cache's and these)
    print(-(-Shape().params() * 2 // (1 << 20)))
