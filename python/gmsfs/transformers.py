"""gmsfs.transformers: a Hugging Face transformers model from a store, loaded once per GPU.

    import gmsfs.transformers
    model = gmsfs.transformers.from_pretrained("/run/gmsfs/GPU-.../llama", "/models/Llama-3-8B")

The first process on the store (nothing committed yet) loads the checkpoint folder's
safetensors at gmsfs-load's speed, in this process (gmsfs.load), and publishes it; every
later process builds the model on the meta device and materializes it: each weight a
zero-copy view of the store, ready in milliseconds.  Engines started together wait for
the one that loads (RW_OR_RO), never on each other, and build their model while they
wait.  The config and the generation config come from the folder, as transformers' own
from_pretrained takes them.  The model's non-persistent buffers (rotary inv_freq: never
in a checkpoint) are computed by its own _init_weights on the store's device by the
process that loads, which stores them too, with the recipe they come from (the folder's
config.json, the config's overrides, the model class, dtype and versions): a later
process whose recipe is the same views them, one whose recipe differs computes its own.
The model comes back in eval mode, on the store's device, with the same logits, bit for
bit, as transformers' from_pretrained of the folder.
"""
import errno
import hashlib
import os

import torch

import gmsfs
import gmsfs._torch_layout as _tl
import gmsfs._torch_materialize as _tm

from . import torch as gt
from ._load import source_differs


def _dtype_of(config, dtype):
    """The dtype asked for, else the checkpoint's (config.dtype, torch_dtype before 5.0):
    a view cannot convert, so a model in another dtype than the store's is refused."""
    if dtype not in (None, "auto"):
        return getattr(torch, dtype) if isinstance(dtype, str) else dtype
    d = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return getattr(torch, d) if isinstance(d, str) else d


def build_meta(config, model_class=None, dtype=None):
    """The model of config, every tensor on the meta device (no memory, no init)."""
    import transformers
    cls = model_class or transformers.AutoModelForCausalLM
    dtype = _dtype_of(config, dtype)
    default = torch.get_default_dtype()
    try:
        if dtype is not None and dtype.is_floating_point:
            torch.set_default_dtype(dtype)
        major = int(transformers.__version__.split(".")[0])
        kw = {} if dtype is None else {"dtype" if major >= 5 else "torch_dtype": dtype}
        with torch.device("meta"):
            return cls.from_config(config, **kw)
    finally:
        torch.set_default_dtype(default)


RECIPE = "transformers/buffers"  # the entry whose value is the stored buffers' recipe


def recipe(path, model, dtype=None, config_kwargs=None, config=None):
    """What model's non-persistent buffers are made from, as a hex digest: the folder's
    config.json, the overrides, the model's class, its dtype, transformers' and PyTorch's
    versions; None for a config object given (its own, which no file says)."""
    if config is not None:
        return None
    import transformers
    with open(os.path.join(path, "config.json"), "rb") as f:
        h = hashlib.sha256(f.read())
    cls = type(model)
    h.update(repr((cls.__module__, cls.__qualname__, str(dtype), sorted((config_kwargs or {}).items()),
                   transformers.__version__, torch.__version__)).encode())
    return h.hexdigest()


def _put_buffers(model, conn, made_from):
    """Store model's non-persistent buffers (made by its code) and their recipe, in the
    writer's session conn."""
    items = [i for i in _tl._tensors(model) if not _tm._persistent(i[1], i[2], i[4])]
    if not items or made_from is None:
        return
    entries = gt._entries(conn, items, lambda name: False)
    entries.append({"key": RECIPE, "alloc": entries[0]["alloc"], "value": made_from})
    conn.meta_put_many(entries)


def materialize(model, conn, made_from):
    """gmsfs.torch.materialize as from_pretrained's readers do it: the store's
    non-persistent buffers are viewed where the recipe they were made from is made_from
    (recipe()), and made by the model's own code where it is not."""
    try:
        same = made_from is not None and conn.meta_get(RECIPE).value == made_from.encode()
    except KeyError:
        same = False
    return gt.materialize(model, conn, own_buffers=not same)


def from_pretrained(store, path, *, model_class=None, dtype=None, timeout=None, read_only=False, config=None,
                    expect=None, **config_kwargs):
    """A model of the checkpoint folder path, its weights in store (a directory of a gmsfs
    mount).  The first process loads path into the store and commits; every process then
    materializes the model from it.  model_class: an AutoModel class or a model class
    (default AutoModelForCausalLM); dtype: the model's (default: the checkpoint's);
    timeout: seconds to wait for the store (None: as long as it takes); read_only: never
    load (ENOENT at once if nothing is committed); config: a config object instead of
    path's; expect: the content hash the store's bytes must have (gmsfs(5), CONTENT HASH;
    a reader's: never loads; GmsfsError EIO for other bytes); config_kwargs go to
    AutoConfig.from_pretrained.  A store that gmsfs.load filled from other files than
    path's, or from path's files before they changed, is refused (GmsfsError ESTALE):
    weights are never served for a checkpoint they are not.  model._gmsfs is the store's
    connection (it holds the read lock), model._gmsfs_published whether this process
    loaded."""
    import transformers
    path = os.fspath(path)
    given = config
    if config is None:
        config = transformers.AutoConfig.from_pretrained(path, **config_kwargs)
    model = build_meta(config, model_class, dtype)  # before the wait: an engine builds while one loads
    made_from = recipe(path, model, dtype, config_kwargs, given)
    if expect is not None:
        conn = gmsfs.connect(store, "ro", timeout, expect=expect)
    else:
        conn = gmsfs.connect(store, "ro" if read_only else "auto", 0 if read_only else timeout)
    published = conn.lock_mode == "rw"
    why = None if published else source_differs(conn, path)
    if why:
        conn.close()
        raise gmsfs.GmsfsError(errno.ESTALE, "%s holds other weights than %s: %s (gmsfs-load --replace %s %s "
                               "loads it in their place)" % (store, path, why, store, path))
    if published:
        try:
            gmsfs.load(conn, path)
            gt.materialize(model, conn)  # its buffers made by its own code, then stored
            _put_buffers(model, conn, made_from)
            conn.commit()
        except BaseException:
            conn.close()  # nothing half loaded stays: the next engine loads
            raise
    else:
        materialize(model, conn, made_from)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen) and getattr(model, "generation_config", None) is not None:
        model.generation_config = transformers.GenerationConfig.from_pretrained(path)
    model.eval()
    model._gmsfs_published = published
    return model
