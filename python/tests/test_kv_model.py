"""The sharing run's model engines (bench/kv_model.py, bench/kv_sharing.py --model): a
decoder's attention over a paged KV cache gives what the whole sequence recomputed gives,
a cache that lost a token's K is seen, and three engines on a host mount map one store of
weights and run both traces' modes with every token read back as written."""
import os
import re
import subprocess
import sys

import pytest

from conftest import mounted, ROOT

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import kv_model  # noqa: E402
import kv_sharing  # noqa: E402

SHAPE = kv_model.Shape(hidden=32, heads=4, layers=2, vocab=64)
TPB = 4
MiB = 1 << 20


def decoder(blocks):
    model = kv_model.Decoder(SHAPE)
    kv_model.init_weights(model)
    cache = torch.zeros(blocks * TPB * SHAPE.token_bytes(torch.float32), dtype=torch.uint8)
    return model, kv_model.PagedDecoder(model, SHAPE, cache, TPB)


def test_paged_attention_is_the_whole_sequence_recomputed():
    model, d = decoder(16)
    # Two sequences whose blocks lie apart and out of order, a prompt each, then decode
    # steps of both in one batch: every step's logits are those of the whole sequence.
    seqs = [([5, 9, 1, 33, 7, 2, 60, 11, 4, 4, 18], [9, 2, 14, 7]), ([3, 8, 21, 40, 6], [0, 12, 5])]
    got = d.step([(t, 0, b) for t, b in seqs])
    for (t, _), logits in zip(seqs, got):
        assert torch.allclose(logits, kv_model.whole_logits(model, SHAPE, t), atol=1e-4)
    for _ in range(5):
        nxt = got.argmax(-1).tolist()
        batch = [([n], len(t), b) for (t, b), n in zip(seqs, nxt)]
        for (t, _), n in zip(seqs, nxt):
            t.append(n)
        got = d.step(batch)
        for (t, _), logits in zip(seqs, got):
            assert torch.allclose(logits, kv_model.whole_logits(model, SHAPE, t), atol=1e-4), len(t)
    # A block given to the wrong sequence changes what it computes: the test could fail.
    t, b = seqs[0]
    wrong = d.step([([t[-1]], len(t) - 1, [b[0], 0, b[2], b[3]])])
    assert not torch.allclose(wrong[0], d.step([([t[-1]], len(t) - 1, b)])[0], atol=1e-4)
    # The run's own check (kv_sharing --model, before it starts) says the same.
    assert kv_model.check(model, SHAPE, prompt=9, steps=6, tpb=TPB) < 1e-5


def test_the_check_sees_a_paged_step_that_reads_the_wrong_slots(monkeypatch):
    model, _ = decoder(1)
    monkeypatch.setattr(kv_model.PagedDecoder, "slot", lambda self, blocks, pos: blocks[0] * self.tpb + pos % self.tpb)
    assert kv_model.check(model, SHAPE, prompt=9, steps=6, tpb=TPB) > 0.1


def test_the_decoder_has_llama_s_parameter_names():
    names = dict(kv_model.Decoder(SHAPE).named_parameters())
    assert len(names) == 3 + 9 * SHAPE.layers and sum(p.numel() for p in names.values()) == SHAPE.params()
    for n in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
              "model.layers.1.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
              "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"):
        assert n in names


def test_a_token_the_cache_lost_is_counted():
    model, d = decoder(8)
    c = kv_sharing.ModelCache(d, SHAPE.vocab, seed=1)
    seq = [6, [3, 1, 5], 20, 1]  # tokens in cache, blocks, length at the end, serial
    c.prefill(seq, 6)
    c.step([seq], [])
    for _ in range(3):
        c.step([], [seq])
        seq[0] += 1
    assert c.check([seq]) == 0
    d.kv[d.slot(seq[1], 0)].zero_()  # the first token's page came back empty
    assert c.check([seq]) == 1
    d.kv[d.slot(seq[1], seq[0] - 1), 0, 0, 0, 0] += 1  # and a byte of the newest changed
    assert c.check([seq]) == 2


@pytest.fixture(scope="module")
def mount():
    yield from mounted("backend=host", "max_bytes=40M")


def test_three_model_engines_share_one_store_of_weights_on_a_host_mount(mount):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "kv_sharing.py"), mount, "--model",
                        "128,4,8,512", "--page-mib", "1", "--seconds", "0.6"],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"paged step against the whole sequence recomputed: logits within \S+ of their spread",
                     r.stdout), r.stdout
    m = re.search(r"\(kv_model.Decoder\): weights ([0-9.]+) MiB in one store, mapped by every engine; caches (\d+) "
                  r"MiB; (\d+) tokens a block", r.stdout)
    weights = kv_model.Shape(128, 4, 8, 512).params() * 4  # float32 on a CPU
    used = float(m.group(1)) * MiB if m else 0  # printed to a tenth of a MiB
    assert m and weights - MiB / 10 <= used < weights + 2 * MiB, r.stdout
    assert 0 <= (40 * MiB - used) / MiB - int(m.group(2)) < 1.2 and m.group(3) == "32", r.stdout
    assert "tokens read back: every one as written" in r.stdout
    for mode in ("fixed", "elastic"):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(mode))
        assert int(line.split("tokens generated")[1]) > 0, line
    assert not [x for x in os.listdir(mount) if x.startswith("kv-")]  # the run's stores, weights too, went
