#!/usr/bin/env python3
"""tests/upstream/integrations_gpu.py MOUNT GMS_LIB: GMS's own integration for vLLM (its
model loader, lib/gpu_memory_service/integrations/vllm/model_loader.py, as fetched into
GMS_LIB) on gmsfs, on the GPU machine: GMS's modules from its tree, gmsfs.gms standing in
for its client (gmsfs.gms.install()), and vLLM, which is not installable here, stubbed at
its boundary only: the loader registry, the model's construction (a transformers Llama of
its own config) and the loading of its weights from a safetensors checkpoint.  Nothing of
gmsfs or GMS is stubbed.

Two engines start one after the other, each a fresh process, with vLLM's `--load-format
gms`: the first finds the store empty and loads from disk (GMS's write mode: the model
made in GMS's memory pool, published, then read back), the second imports it (read mode:
a model on the meta device materialized from the store).  Both must give the logits of
the checkpoint loaded by transformers alone, bit for bit between the two engines.  TAP."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# vLLM at its boundary: what GMS's vLLM loader imports from vllm, and no more.
VLLM_STUB = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/torch_utils.py": """
        import contextlib
        import torch

        @contextlib.contextmanager
        def set_default_torch_dtype(dtype):
            old = torch.get_default_dtype()
            torch.set_default_dtype(dtype)
            try:
                yield
            finally:
                torch.set_default_dtype(old)
    """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/model_loader/__init__.py": """
        LOADERS = {}

        def register_model_loader(load_format):
            def register(cls):
                LOADERS[load_format] = cls
                return cls
            return register
    """,
    "vllm/model_executor/model_loader/base_loader.py": """
        class BaseModelLoader:
            def __init__(self, load_config):
                self.load_config = load_config
    """,
    "vllm/model_executor/model_loader/default_loader.py": """
        import os
        import torch
        from safetensors.torch import load_file
        from vllm.model_executor.model_loader.base_loader import BaseModelLoader

        class DefaultModelLoader(BaseModelLoader):
            def download_model(self, model_config):
                pass

            def load_weights(self, model, model_config):
                tensors = load_file(os.path.join(model_config.model, "model.safetensors"))
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(tensors[name])
    """,
    "vllm/model_executor/model_loader/utils.py": """
        from transformers import LlamaForCausalLM

        def initialize_model(vllm_config, model_config):
            return LlamaForCausalLM(model_config.hf_config)

        def process_weights_after_loading(model, model_config, target_device):
            pass
    """,
}

ENGINE = """
import dataclasses, json, sys, types
import torch
import gmsfs.gms
gmsfs.gms.install()
from transformers import LlamaConfig
from gpu_memory_service.integrations.vllm import model_loader as gms_loader
from vllm.model_executor.model_loader import LOADERS

@dataclasses.dataclass
class LoadConfig:
    load_format: str = "gms"
    model_loader_extra_config: dict = dataclasses.field(default_factory=dict)

ckpt, out = sys.argv[1:3]
torch.cuda.set_device(0)
gms_loader.register_gms_loader("gms")
config = LlamaConfig.from_pretrained(ckpt)
model_config = types.SimpleNamespace(model=ckpt, dtype=torch.bfloat16, hf_config=config)
model = LOADERS["gms"](LoadConfig()).load_model(types.SimpleNamespace(), model_config)
from gpu_memory_service.client.torch.allocator import get_gms_client_memory_manager
manager = get_gms_client_memory_manager("weights")
ids = torch.arange(0, 64, device="cuda").reshape(2, 32) % config.vocab_size
with torch.no_grad():
    logits = model(input_ids=ids).logits.float().cpu()
torch.save(logits, out)
print(json.dumps({"granted": manager.granted_lock_type.name, "bytes": gms_loader.get_imported_weights_bytes(),
                  "on_gpu": all(p.is_cuda for p in model.parameters())}))
"""


def main():
    mount, gms_lib = sys.argv[1], os.path.abspath(sys.argv[2])
    n, failed = 0, 0

    def t(ok, what):
        nonlocal n, failed
        n += 1
        failed += not ok
        print("%s %d - %s" % ("ok" if ok else "not ok", n, what), flush=True)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    work = tempfile.mkdtemp(prefix="gms-integrations.")
    for rel, text in VLLM_STUB.items():
        path = os.path.join(work, "stub", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
    ckpt = os.path.join(work, "ckpt")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False,
                         torch_dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(ckpt, safe_serialization=True)
    reference = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16).cuda().eval()
    ids = torch.arange(0, 64, device="cuda").reshape(2, 32) % config.vocab_size
    with torch.no_grad():
        want = reference(input_ids=ids).logits.float().cpu()
    del reference

    env = dict(os.environ, GMSFS_GMS_MOUNT=mount,
               PYTHONPATH=os.pathsep.join([os.path.join(work, "stub"), os.path.join(ROOT, "python"), gms_lib]))
    def state():
        fields = {}
        for line in open(os.path.join(mount, "weights", "state")):
            k, _, v = line.partition(": ")
            fields[k] = v.strip()
        return fields

    got, generation = {}, {}
    for engine in ("first", "second"):
        out = os.path.join(work, engine + ".pt")
        r = subprocess.run([sys.executable, "-c", ENGINE, ckpt, out], env=env, capture_output=True, text=True,
                           timeout=300)
        said = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
        if not said:
            print("# %s engine failed (%d):\n# %s" % (engine, r.returncode, r.stderr[-3000:].replace("\n", "\n# ")))
        got[engine] = (json.loads(said) if said else {}), (torch.load(out) if said else None)
        generation[engine] = state().get("generation")  # a commit is a load from disk
        print("# %s engine: %s; the store's commits after it: %s" % (engine, said or "-", generation[engine]))
    first, second = got["first"], got["second"]
    # GMS's write mode ends in read mode (finalize_gms_write: commit, then connect RO).
    t(generation["first"] == "1" and first[0].get("granted") == "RO" and first[0].get("bytes", 0) > 0 and
      first[0].get("on_gpu"), "the first engine finds the store empty: GMS's write mode loads from disk, publishes "
      "and reads it back")
    t(generation["second"] == "1" and second[0].get("granted") == "RO" and
      second[0].get("bytes") == first[0].get("bytes") and second[0].get("on_gpu"),
      "the second engine, a fresh process, imports the published weights: GMS's read mode, no commit")
    t(first[1] is not None and second[1] is not None and torch.equal(first[1], second[1]),
      "both engines give the same logits, bit for bit")
    close = first[1] is not None and torch.allclose(first[1], want, atol=2e-2, rtol=0)
    t(close, "they are the checkpoint's logits, as transformers alone computes them%s" % (
        "" if first[1] is None else " (largest difference %.2e)" % (first[1] - want).abs().max().item()))
    last = state()
    t(last.get("state") == "COMMITTED" and int(last.get("allocations", 0)) > 0 and last.get("read_handles") == "0",
      "the store is committed with the model's allocations (%s of them), no reader left" % last.get("allocations"))
    print("1..%d" % n)
    print("%d passed, %d failed" % (n - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
