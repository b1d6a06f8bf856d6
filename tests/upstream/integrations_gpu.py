#!/usr/bin/env python3
"""tests/upstream/integrations_gpu.py MOUNT GMS_LIB: GMS's own integrations for vLLM and
TensorRT-LLM (their model loaders, lib/gpu_memory_service/integrations/{vllm,trtllm}/
model_loader.py, as fetched into GMS_LIB) on gmsfs, on the GPU machine: GMS's modules from its tree, gmsfs.gms standing in
for its client (gmsfs.gms.install()), and the engines, which are not installable here,
stubbed at their boundaries only: vLLM's loader registry, TRT-LLM's ModelLoader, the
model's construction (a transformers Llama of its own config) and the loading of its
weights from a safetensors checkpoint.  Nothing of gmsfs or GMS is stubbed.

For each, two engines start one after the other, each a fresh process, with `--load-format
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


# TensorRT-LLM at its boundary: what GMS's TRT-LLM loader imports from tensorrt_llm, and
# no more: its ModelLoader (load: a transformers Llama made on the GPU, in bfloat16, its
# weights from the safetensors checkpoint), its rank storage count, AutoModelForCausalLM,
# MetaInitMode (the meta device), timing, and a MoE load balancer that a dense model has not.
TRTLLM_STUB = {
    "tensorrt_llm/__init__.py": "",
    "tensorrt_llm/_torch/__init__.py": "",
    "tensorrt_llm/_torch/pyexecutor/__init__.py": "",
    "tensorrt_llm/_torch/pyexecutor/model_loader.py": """
        import os
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig, LlamaForCausalLM

        def get_rank_model_storage(model):
            return sum(p.numel() * p.element_size() for p in model.parameters())

        class ModelLoader:
            mapping = None
            model_weights_memory_tag = "model_weights"

            def _load_and_validate_config(self, checkpoint_dir, checkpoint_loader):
                return LlamaConfig.from_pretrained(checkpoint_dir)

            def load(self, checkpoint_dir, checkpoint_loader):
                config = self._load_and_validate_config(checkpoint_dir, checkpoint_loader)
                before = torch.get_default_dtype()
                torch.set_default_dtype(torch.bfloat16)
                try:
                    with torch.device("cuda"):
                        model = LlamaForCausalLM(config).eval()
                finally:
                    torch.set_default_dtype(before)
                tensors = load_file(os.path.join(checkpoint_dir, "model.safetensors"))
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(tensors[name])
                return model, None
    """,
    "tensorrt_llm/_torch/models/__init__.py": """
        from transformers import LlamaForCausalLM

        class AutoModelForCausalLM:
            @staticmethod
            def from_config(config):
                return LlamaForCausalLM(config).eval()
    """,
    "tensorrt_llm/_torch/models/modeling_utils.py": """
        import contextlib
        import torch

        @contextlib.contextmanager
        def MetaInitMode():
            before = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with torch.device("meta"):
                    yield
            finally:
                torch.set_default_dtype(before)

        @contextlib.contextmanager
        def timing(name):
            yield
    """,
    "tensorrt_llm/_torch/modules/__init__.py": "",
    "tensorrt_llm/_torch/modules/fused_moe/__init__.py": "",
    "tensorrt_llm/_torch/modules/fused_moe/moe_load_balancer.py": """
        import contextlib

        class MoeLoadBalancer:
            pass

        @contextlib.contextmanager
        def maybe_create_moe_load_balancer(config, mapping):
            yield None
    """,
}

ENGINE_TRTLLM = """
import json, sys
import torch
import gmsfs.gms
gmsfs.gms.install()
from gpu_memory_service.integrations.trtllm import setup_gms
from gpu_memory_service.integrations.trtllm import model_loader as gms_loader
import tensorrt_llm._torch.pyexecutor.model_loader as trt

ckpt, out = sys.argv[1:3]
torch.cuda.set_device(0)
setup_gms({})
loader = trt.ModelLoader()
model, balancer = loader.load(ckpt, None)
from gpu_memory_service.client.torch.allocator import get_gms_client_memory_manager
manager = get_gms_client_memory_manager("weights")
ids = torch.arange(0, 64, device="cuda").reshape(2, 32) % model.config.vocab_size
with torch.no_grad():
    logits = model(input_ids=ids).logits.float().cpu()
torch.save(logits, out)
print(json.dumps({"granted": manager.granted_lock_type.name, "bytes": gms_loader.get_imported_weights_bytes(),
                  "storage": trt.get_rank_model_storage(model), "tag": loader.model_weights_memory_tag,
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
    store = os.path.join(mount, "weights")

    def state():
        fields = {}
        for line in open(os.path.join(store, "state")):
            k, _, v = line.partition(": ")
            fields[k] = v.strip()
        return fields

    for engine_name, stub, engine_code in (("vLLM", VLLM_STUB, ENGINE), ("TRT-LLM", TRTLLM_STUB, ENGINE_TRTLLM)):
        for rel, text in stub.items():
            path = os.path.join(work, engine_name, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(textwrap.dedent(text))
        env = dict(os.environ, GMSFS_GMS_MOUNT=mount,
                   PYTHONPATH=os.pathsep.join([os.path.join(work, engine_name), os.path.join(ROOT, "python"), gms_lib]))
        got, generation = {}, {}
        for engine in ("first", "second"):
            out = os.path.join(work, engine_name + "-" + engine + ".pt")
            r = subprocess.run([sys.executable, "-c", engine_code, ckpt, out], env=env, capture_output=True,
                               text=True, timeout=300)
            said = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
            if not said:
                print("# %s %s engine failed (%d):\n# %s" % (engine_name, engine, r.returncode,
                                                             r.stderr[-3000:].replace("\n", "\n# ")))
            got[engine] = (json.loads(said) if said else {}), (torch.load(out) if said else None)
            generation[engine] = state().get("generation") if os.path.isdir(store) else None  # a commit: a load
            print("# %s %s engine: %s; the store's commits after it: %s" % (engine_name, engine, said or "-",
                                                                          generation[engine]))
        first, second = got["first"], got["second"]
        # GMS's write mode ends in read mode (finalize_gms_write: commit, then connect RO).
        t(generation["first"] == "1" and first[0].get("granted") == "RO" and first[0].get("bytes", 0) > 0 and
          first[0].get("on_gpu"), "%s: the first engine finds the store empty: GMS's write mode loads from disk, "
          "publishes and reads it back" % engine_name)
        t(generation["second"] == "1" and second[0].get("granted") == "RO" and
          second[0].get("bytes") == first[0].get("bytes") and second[0].get("on_gpu"),
          "%s: the second engine, a fresh process, imports the published weights: GMS's read mode, no commit"
          % engine_name)
        t(first[1] is not None and second[1] is not None and torch.equal(first[1], second[1]),
          "%s: both engines give the same logits, bit for bit" % engine_name)
        close = first[1] is not None and torch.allclose(first[1], want, atol=2e-2, rtol=0)
        t(close, "%s: they are the checkpoint's logits, as transformers alone computes them%s" % (
            engine_name, "" if first[1] is None else " (largest difference %.2e)" % (first[1] - want).abs().max().item()))
        last = state()
        t(last.get("state") == "COMMITTED" and int(last.get("allocations", 0)) > 0 and last.get("read_handles") == "0",
          "%s: the store is committed with the model's allocations (%s of them), no reader left" % (
              engine_name, last.get("allocations")))
        if engine_name == "TRT-LLM":
            t(second[0].get("storage") == second[0].get("bytes") and first[0].get("tag") == "model_weights",
              "TRT-LLM: its rank storage is the bytes imported (GMS's patch), its memory tag put back after the load")
        os.rmdir(store)  # the next integration starts from an empty store
    print("1..%d" % n)
    print("%d passed, %d failed" % (n - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
