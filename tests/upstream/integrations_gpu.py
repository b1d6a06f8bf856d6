#!/usr/bin/env python3
"""tests/upstream/integrations_gpu.py MOUNT GMS_LIB: GMS's own integrations for vLLM,
TensorRT-LLM and SGLang (lib/gpu_memory_service/integrations/{vllm,trtllm,sglang}: their
model loaders, vLLM's GMSWorker (sleep and wake), SGLang's memory saver and patches, as
fetched into GMS_LIB) on gmsfs,
on the GPU machine: GMS's modules from its tree, gmsfs.gms standing in
for its client (gmsfs.gms.install()), and the engines, which are not installable here,
stubbed at their boundaries only: vLLM's loader registry, TRT-LLM's ModelLoader, SGLang's
loaders, ModelRunner and torch_memory_saver's singleton, the model's construction (a transformers Llama of its own config) and the loading of its
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

# vLLM's worker at its boundary, for GMS's GMSWorker (sleep and wake): the loader's
# stubs above, and Worker (its init_device and load_model: the runner's), the platform's
# set_device, the KV connector's set-up (none).  The model runner is the engine script's.
VLLM_WORKER_STUB = dict(VLLM_STUB, **{
    "vllm/v1/__init__.py": "",
    "vllm/v1/worker/__init__.py": "",
    "vllm/v1/worker/gpu_worker.py": """
        class Worker:
            def init_device(self):
                pass

            def load_model(self, *args, **kwargs):
                self.model_runner.load_model()
    """,
    "vllm/platforms/__init__.py": """
        import types
        import torch
        current_platform = types.SimpleNamespace(set_device=torch.cuda.set_device)
    """,
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/kv_transfer/__init__.py": """
        def ensure_kv_transfer_initialized(vllm_config, kv_cache_config):
            pass
    """,
})

# What every engine script starts with: gmsfs.gms standing in for GMS's client, the
# loader config an engine passes, the checkpoint and where its logits go, the GPU.
PRELUDE = """
import dataclasses, json, sys, types
import torch
import gmsfs.gms
gmsfs.gms.install()
from transformers import LlamaConfig

@dataclasses.dataclass
class LoadConfig:
    load_format: str = "gms"
    model_loader_extra_config: dict = dataclasses.field(default_factory=dict)

ckpt, out = sys.argv[1:3]
torch.cuda.set_device(0)

def sleep_and_wake(model, kv, vocab, sleep, wake):
    # The logits saved to out; then the engine's sleep and wake (sleep, wake: its calls):
    # the weights and the KV cache at the same addresses, the same logits, the KV cache's
    # memory given back while asleep and written again after.
    kv.fill_(3)
    ids = torch.arange(0, 64, device=kv.device).reshape(2, 32) % vocab
    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits.float().cpu()
    before = logits()
    torch.save(before, out)
    ptrs = [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()]
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    sleep()
    free1 = torch.cuda.mem_get_info()[0]
    wake()
    kv.fill_(5)
    return {"same_ptrs": ptrs == [p.data_ptr() for p in model.parameters()] + [kv.data_ptr()],
            "same_logits": torch.equal(before, logits()), "kv_freed": free1 - free0, "kv_bytes": kv.numel() * kv.element_size(),
            "kv_after": kv[:4].float().tolist()}
"""

ENGINE = PRELUDE + """
from gpu_memory_service.integrations.vllm import model_loader as gms_loader
from vllm.model_executor.model_loader import LOADERS
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

ENGINE_VLLM_WORKER = PRELUDE + """
from gpu_memory_service.integrations.vllm.worker import GMSWorker
from vllm.model_executor.model_loader import LOADERS
config = LlamaConfig.from_pretrained(ckpt)
model_config = types.SimpleNamespace(model=ckpt, dtype=torch.bfloat16, hf_config=config, enable_sleep_mode=True)

class Runner:  # vLLM's GPUModelRunner: the model through --load-format gms, its KV cache
    kv_caches = []

    def load_model(self):
        self.model = LOADERS["gms"](LoadConfig()).load_model(types.SimpleNamespace(), model_config)

    def initialize_kv_cache(self, kv_cache_config):
        self.kv_caches = [torch.empty(kv_cache_config.num_bytes // 2, device="cuda", dtype=torch.bfloat16)]

worker = GMSWorker()
worker.local_rank = 0
worker.vllm_config = types.SimpleNamespace(load_config=LoadConfig(), model_config=model_config)
worker.cache_config = types.SimpleNamespace(cache_dtype="auto")
worker.model_runner = Runner()
worker.init_device()
worker.load_model()
worker.initialize_from_config(types.SimpleNamespace(num_bytes=1 << 30))
model, kv = worker.model_runner.model, worker.model_runner.kv_caches[0]
slept = sleep_and_wake(model, kv, config.vocab_size, lambda: worker.sleep(1), worker.wake_up)
from gpu_memory_service.client.torch.allocator import get_gms_client_memory_manager
from gpu_memory_service.integrations.vllm import model_loader as gms_loader
print(json.dumps(dict(slept, granted=get_gms_client_memory_manager("weights").granted_lock_type.name,
                      bytes=gms_loader.get_imported_weights_bytes(), on_gpu=all(p.is_cuda for p in model.parameters()),
                      usage=worker.model_runner.__dict__.get("model_memory_usage"))))
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

ENGINE_TRTLLM = PRELUDE + """
from gpu_memory_service.integrations.trtllm import setup_gms
from gpu_memory_service.integrations.trtllm import model_loader as gms_loader
import tensorrt_llm._torch.pyexecutor.model_loader as trt
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


# SGLang at its boundary: its loaders (DefaultModelLoader, get_model), ModelRunner's
# init_memory_pool, the scheduler's static-state export, and torch_memory_saver (the
# singleton SGLang's memory saver adapter calls: region, pause, resume), as SGLang 0.5.9
# and torch_memory_saver give them, with nothing behind them.
SGLANG_STUB = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/model_loader/__init__.py": """
        import torch
        from transformers import LlamaForCausalLM

        def get_model(*, model_config, load_config, device_config):
            before = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                return LlamaForCausalLM(model_config.hf_config).eval()
            finally:
                torch.set_default_dtype(before)
    """,
    "sglang/srt/model_loader/loader.py": """
        import os
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaForCausalLM

        class DefaultModelLoader:
            def __init__(self, load_config):
                self.load_config = load_config

            def load_model(self, *, model_config, device_config):
                before = torch.get_default_dtype()
                torch.set_default_dtype(torch.bfloat16)
                try:
                    with torch.device("cuda"):
                        model = LlamaForCausalLM(model_config.hf_config).eval()
                finally:
                    torch.set_default_dtype(before)
                tensors = load_file(os.path.join(model_config.model_path, "model.safetensors"))
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(tensors[name])
                return model
    """,
    "sglang/srt/model_loader/utils.py": """
        def process_model_weights_after_loading(model, model_config):
            pass
    """,
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/model_runner.py": """
        class ModelRunner:
            def init_memory_pool(self, total_gpu_memory, max_num_reqs=None):
                return total_gpu_memory
    """,
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/scheduler_update_weights_mixin.py": """
        def _export_static_state(model):
            return dict(buffers=[(n, b.detach().clone()) for n, b in model.named_buffers()])

        def _import_static_state(model, static_params):
            pass
    """,
    "torch_memory_saver/__init__.py": """
        import contextlib
        from .entrypoint import TorchMemorySaver

        torch_memory_saver = TorchMemorySaver()

        @contextlib.contextmanager
        def configure_subprocess():
            yield
    """,
    "torch_memory_saver/entrypoint.py": """
        class TorchMemorySaver:
            def __init__(self):
                self._impl = None
                self._impl_ctor_kwargs = {}

            def _ensure_initialized(self):
                raise RuntimeError("torch_memory_saver's own hooks need its LD_PRELOAD library")

            def region(self, tag, enable_cpu_backup=False):
                self._ensure_initialized()
                return self._impl.region(tag, enable_cpu_backup)

            def pause(self, tag=None):
                self._ensure_initialized()
                self._impl.pause(tag)

            def resume(self, tag=None):
                self._ensure_initialized()
                self._impl.resume(tag)
    """,
}

ENGINE_SGLANG = PRELUDE + """
from gpu_memory_service.integrations.sglang import setup_gms
Loader = setup_gms(types.SimpleNamespace(load_format="gms", model_loader_extra_config="{}"))
import torch_memory_saver
tms = torch_memory_saver.torch_memory_saver
config = LlamaConfig.from_pretrained(ckpt)
model_config = types.SimpleNamespace(model_path=ckpt, hf_config=config, dtype=torch.bfloat16)
with tms.region("weights"):  # as SGLang's ModelRunner wraps its load
    model = Loader(LoadConfig()).load_model(model_config=model_config, device_config=types.SimpleNamespace(device="cuda"))
impl = tms.gms_impl
with tms.region("kv_cache"):  # its KV cache: always a writer's
    kv = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)
# SGLang's release_memory_occupation and resume_memory_occupation (the same addresses)
slept = sleep_and_wake(model, kv, config.vocab_size, tms.pause, tms.resume)
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.managers import scheduler_update_weights_mixin as mixin
total_gib = torch.cuda.get_device_properties(0).total_memory / (1 << 30)
print(json.dumps(dict(slept, granted=impl.allocators["weights"].granted_lock_type.name,
                      bytes=impl.imported_weights_bytes, on_gpu=all(p.is_cuda for p in model.parameters()),
                      pool_baseline=ModelRunner().init_memory_pool(1.0) == total_gib,
                      static_noop=mixin._export_static_state(model) == {"buffers": []})))
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

    for engine_name, stub, engine_code in (("vLLM", VLLM_STUB, ENGINE), ("vLLM's worker", VLLM_WORKER_STUB,
                                                                          ENGINE_VLLM_WORKER),
                                           ("TRT-LLM", TRTLLM_STUB, ENGINE_TRTLLM), ("SGLang", SGLANG_STUB, ENGINE_SGLANG)):
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
        if engine_name in ("SGLang", "vLLM's worker"):
            f, g = first[0], second[0]
            t(all(x.get("same_ptrs") and x.get("same_logits") and x.get("kv_freed", 0) >= 0.9 * x.get("kv_bytes", 1)
                  and x.get("kv_after") == [5.0] * 4 for x in (f, g)),
              "%s: a sleep and a wake: the weights and the KV cache at the same addresses, the same logits, the KV "
              "cache's memory given back while asleep (%s of %s bytes) and written again after, in both engines"
              % (engine_name, [x.get("kv_freed") for x in (f, g)], f.get("kv_bytes")))
        if engine_name == "vLLM's worker":
            t(all(x.get("usage") == x.get("bytes") for x in (f, g)),
              "vLLM's worker: GMSWorker.load_model counts the imported bytes as the model's memory (%s)" % g.get("usage"))
            kv_store = os.path.join(mount, "kv_cache")
            if os.path.isdir(kv_store):
                os.rmdir(kv_store)
        if engine_name == "SGLang":
            t(all(x.get("pool_baseline") and x.get("static_noop") for x in (f, g)),
              "SGLang: GMS's patches of ModelRunner.init_memory_pool (the device's whole memory as the baseline) "
              "and of the scheduler's static state (a no-op) are in place")
            kv_store = os.path.join(mount, "kv_cache")
            if os.path.isdir(kv_store):
                os.rmdir(kv_store)
        os.rmdir(store)  # the next integration starts from an empty store
    print("1..%d" % n)
    print("%d passed, %d failed" % (n - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
