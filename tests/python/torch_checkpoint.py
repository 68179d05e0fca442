"""torch.load of a muon-cpp checkpoint on any PyTorch: from 2.6 on torch.load reads weights only
by default, and the file's typed containers name a few functions of torch.jit._pickle that
PyTorch's own C++ pickler writes (restore_type_tag, build_doublelist, ...); those are allowed by
name rather than loading unrestricted."""
import torch


def load_checkpoint(path):
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:  # PyTorch < 2.5: no weights-only default to satisfy
        return torch.load(path)
    import torch.jit._pickle as jit_pickle
    allowed = [getattr(jit_pickle, name) for name in dir(jit_pickle)
               if name == "restore_type_tag" or name.startswith("build_")]
    with safe_globals(allowed):
        return torch.load(path, weights_only=True)
